import { IntegTest } from '@aws-cdk/integ-tests-alpha';
import { App, Duration, RemovalPolicy, Stack } from 'aws-cdk-lib';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { ConcurrencyControlledWorkflow, SemaphoreTable } from '../src';
import { executionEnds, noPermitHeld, startExecution } from './assertions';

/*
 * Failure paths on AWS: a body that fails gives its permit back and fails the execution with its
 * own error; an execution stopped inside the body gets its permit back through the cleanup rule.
 */
const app = new App();
const stack = new Stack(app, 'SemaphoreFailedBody');
const table = new SemaphoreTable(stack, 'Locks', { removalPolicy: RemovalPolicy.DESTROY });
const workflow = new ConcurrencyControlledWorkflow(stack, 'Workflow', {
  table,
  lockName: 'integ-failed-body',
  body: new sfn.Choice(stack, 'Fail Or Wait')
    .when(sfn.Condition.booleanEquals('$.fail', true), new sfn.Fail(stack, 'Body Fails', { error: 'BodyFailed', cause: 'on purpose' }))
    .otherwise(new sfn.Wait(stack, 'Work For Long', { time: sfn.WaitTime.duration(Duration.minutes(10)) })),
});

const integ = new IntegTest(app, 'FailedBody', { testCases: [stack] });

const failing = startExecution(integ, workflow, { fail: true });
const stopped = startExecution(integ, workflow, { fail: false });
const stop = integ.assertions.awsApiCall('StepFunctions', 'stopExecution', { executionArn: stopped.getAttString('executionArn') });

failing
  .next(executionEnds(integ, failing, { status: 'FAILED', error: 'BodyFailed', cause: 'on purpose' }))
  .next(noPermitHeld(integ, workflow, 'AfterFailure'))
  .next(stopped)
  .next(stop)
  .next(executionEnds(integ, stopped, { status: 'ABORTED' }))
  // Freed by the cleanup state machine, started by the rule on the ABORTED status-change event.
  .next(noPermitHeld(integ, workflow, 'AfterStop'));
