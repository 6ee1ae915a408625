import * as logs from 'aws-cdk-lib/aws-logs';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { Construct } from 'constructs';

/**
 * Logging for a state machine we create: what the user passed, or a new log group receiving every
 * event (level ALL, which cdk-nag's AwsSolutions-SF1 asks for) without execution data, which may be
 * sensitive and is not needed to follow a permit.
 */
export function stateMachineLogs(scope: Construct, logOptions: sfn.LogOptions | undefined): sfn.LogOptions {
  if (logOptions) {
    return logOptions;
  }
  const destination = new logs.LogGroup(scope, 'LogGroup', { retention: logs.RetentionDays.THREE_MONTHS });
  return { destination, level: sfn.LogLevel.ALL, includeExecutionData: false };
}
