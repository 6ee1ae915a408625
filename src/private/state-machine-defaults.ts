import * as logs from 'aws-cdk-lib/aws-logs';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { Construct } from 'constructs';

/**
 * Logging for a state machine we create: what the user passed, or a new log group receiving every
 * event (level ALL, which cdk-nag's AwsSolutions-SF1 asks for) without execution data, which may be
 * sensitive and is not needed to follow a permit.
 */
export function stateMachineLogs(
  scope: Construct,
  logOptions: sfn.LogOptions | undefined,
): sfn.LogOptions & { readonly destination: logs.ILogGroup } {
  if (logOptions) {
    // aws-cdk-lib lets a state machine log nowhere; ours log to a group (the workflows' metrics filter it).
    if (logOptions.destination === undefined) {
      throw new Error('logs.destination is missing: the state machines of cdk-sfn-semaphore log to a log group (omit `logs` for a new one)');
    }
    return { ...logOptions, destination: logOptions.destination };
  }
  const destination = new logs.LogGroup(scope, 'LogGroup', { retention: logs.RetentionDays.THREE_MONTHS });
  return { destination, level: sfn.LogLevel.ALL, includeExecutionData: false };
}
