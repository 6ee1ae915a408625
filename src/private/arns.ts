import { Arn, ArnFormat, Stack } from 'aws-cdk-lib';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { Construct } from 'constructs';

/** ARN pattern of every execution of a state machine: `arn:...:execution:<state machine name>:*`. */
export function executionArnPattern(scope: Construct, stateMachine: sfn.IStateMachine): string {
  const name = Arn.split(stateMachine.stateMachineArn, ArnFormat.COLON_RESOURCE_NAME).resourceName;
  return Stack.of(scope).formatArn({
    service: 'states',
    resource: 'execution',
    resourceName: `${name}:*`,
    arnFormat: ArnFormat.COLON_RESOURCE_NAME,
  });
}
