import { IntegTest } from '@aws-cdk/integ-tests-alpha';
import { App, Duration, RemovalPolicy, Stack } from 'aws-cdk-lib';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { ConcurrencyControlledWorkflow, SemaphoreTable } from '../src';
import { executionEnds, noPermitHeld, startExecution } from './assertions';

/*
 * Happy path on AWS: an execution takes a permit, runs its body, gives the permit back and returns
 * the body's output.
 */
const app = new App();
const stack = new Stack(app, 'SemaphoreHappyPath');
const table = new SemaphoreTable(stack, 'Locks', { removalPolicy: RemovalPolicy.DESTROY });
const workflow = new ConcurrencyControlledWorkflow(stack, 'Workflow', {
  table,
  concurrencyLimit: 2,
  body: new sfn.Wait(stack, 'Work', { time: sfn.WaitTime.duration(Duration.seconds(5)) }).next(
    new sfn.Pass(stack, 'Report', { parameters: { 'done': true, 'request.$': '$.request' } }),
  ),
});

const integ = new IntegTest(app, 'HappyPath', { testCases: [stack] });
const start = startExecution(integ, workflow, { request: 'integ' });
start
  .next(executionEnds(integ, start, { status: 'SUCCEEDED', output: JSON.stringify({ done: true, request: 'integ' }) }))
  .next(noPermitHeld(integ, workflow));
