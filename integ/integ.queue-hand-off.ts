import { IntegTest } from '@aws-cdk/integ-tests-alpha';
import { App, Duration, RemovalPolicy, Stack } from 'aws-cdk-lib';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { ConcurrencyControlledWorkflow, SemaphoreTable, WaitStrategy } from '../src';
import { executionEnds, noPermitHeld, startExecution } from './assertions';

/*
 * A hand-off through the queue on AWS: with one permit, a second execution waits in the lock's queue,
 * and the first one's release hands it the permit and wakes it with SendTaskSuccess. The wake-up is
 * granted on the waiting workflow's state machine ARN only (src/private/wake-grants.ts), which this
 * test is the proof of: were the call denied, the waiter would sleep until its queueCheckInterval (30
 * minutes) and miss the 5 minutes its assertion waits.
 */
const app = new App();
const stack = new Stack(app, 'SemaphoreQueueHandOff');
const table = new SemaphoreTable(stack, 'Locks', { removalPolicy: RemovalPolicy.DESTROY });
const workflow = new ConcurrencyControlledWorkflow(stack, 'Workflow', {
  table,
  concurrencyLimit: 1,
  waitStrategy: WaitStrategy.QUEUE,
  queueCheckInterval: Duration.minutes(30),
  body: new sfn.Wait(stack, 'Work', { time: sfn.WaitTime.duration(Duration.seconds(30)) }).next(
    new sfn.Pass(stack, 'Report', { parameters: { 'done': true, 'request.$': '$.request' } }),
  ),
});

const integ = new IntegTest(app, 'QueueHandOff', { testCases: [stack] });
const holder = startExecution(integ, workflow, { request: 'holder' });
const waiter = startExecution(integ, workflow, { request: 'waiter' });
holder
  .next(waiter)
  .next(executionEnds(integ, holder, { status: 'SUCCEEDED', output: JSON.stringify({ done: true, request: 'holder' }) }))
  .next(executionEnds(integ, waiter, { status: 'SUCCEEDED', output: JSON.stringify({ done: true, request: 'waiter' }) }))
  .next(noPermitHeld(integ, workflow));
