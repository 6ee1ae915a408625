import { ExpectedResult, IApiCall, IntegTest } from '@aws-cdk/integ-tests-alpha';
import { Duration } from 'aws-cdk-lib';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { ConcurrencyControlledWorkflow } from '../src';

/*
 * Assertion helpers shared by the integ tests (this file is not an integ test itself: integ-runner
 * only picks up files named integ.*.ts).
 */

/** Start an execution of the workflow with `input`. */
export function startExecution(integ: IntegTest, workflow: { readonly stateMachine: sfn.IStateMachine }, input: object): IApiCall {
  return integ.assertions.awsApiCall('StepFunctions', 'startExecution', {
    stateMachineArn: workflow.stateMachine.stateMachineArn,
    input: JSON.stringify(input),
  });
}

/** Wait until the execution started by `start` is described as `expected` (status, output, error...). */
export function executionEnds(integ: IntegTest, start: IApiCall, expected: Record<string, unknown>): IApiCall {
  const describe = integ.assertions.awsApiCall('StepFunctions', 'describeExecution', {
    executionArn: start.getAttString('executionArn'),
  });
  describe.expect(ExpectedResult.objectLike(expected));
  describe.waitForAssertions({ totalTimeout: Duration.minutes(5), interval: Duration.seconds(10) });
  return describe;
}

/**
 * Wait until no permit of the workflow's lock is held. `when` names the check: assertions are
 * identified by their parameters, so two identical checks in one test need different aliases.
 */
export function noPermitHeld(integ: IntegTest, workflow: ConcurrencyControlledWorkflow, when = 'Now'): IApiCall {
  const get = integ.assertions.awsApiCall('DynamoDB', 'getItem', {
    TableName: workflow.table.tableName,
    Key: { lockName: { S: workflow.lockName } },
    ProjectionExpression: `#permits${when}`,
    ExpressionAttributeNames: { [`#permits${when}`]: 'permitsInUse' },
    ConsistentRead: true,
  });
  get.expect(ExpectedResult.objectLike({ Item: { permitsInUse: { N: '0' } } }));
  get.waitForAssertions({ totalTimeout: Duration.minutes(5), interval: Duration.seconds(10) });
  return get;
}
