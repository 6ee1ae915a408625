import { IntegTest } from '@aws-cdk/integ-tests-alpha';
import { App, RemovalPolicy, Stack } from 'aws-cdk-lib';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { IdempotencyKey, IdempotencyTable, IdempotentWorkflow } from '../src';
import { executionEnds, startExecution } from './assertions';

/*
 * Idempotency on AWS: the first execution runs the body and stores its output; a repeat with the same
 * key (other fields differ) returns that output. Its state names show it did not run the body.
 */
const app = new App();
const stack = new Stack(app, 'SemaphoreIdempotentWorkflow');
const table = new IdempotencyTable(stack, 'Records', { removalPolicy: RemovalPolicy.DESTROY });
const workflow = new IdempotentWorkflow(stack, 'Workflow', {
  table,
  key: IdempotencyKey.fromFields('$.orderId'),
  body: new sfn.Pass(stack, 'Work', { parameters: { 'processed.$': '$.orderId', 'firstNote.$': '$.note' } }),
});

const integ = new IntegTest(app, 'Idempotency', { testCases: [stack] });
const first = startExecution(integ, workflow, { orderId: 'o-1', note: 'first' });
const expected = { status: 'SUCCEEDED', output: JSON.stringify({ processed: 'o-1', firstNote: 'first' }) };
first.next(executionEnds(integ, first, expected)).next(
  (() => {
    const repeat = startExecution(integ, workflow, { note: 'second', orderId: 'o-1' });
    repeat.next(executionEnds(integ, repeat, expected));
    return repeat;
  })(),
);
