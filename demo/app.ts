import * as path from 'path';
import { App, Duration, Stack } from 'aws-cdk-lib';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { Construct } from 'constructs';
import { ConcurrencyControlledWorkflow, ConcurrencyControlledWorkflowProps } from '../src';

/**
 * The demo's unit of work: a Lambda function that takes `workSeconds` and fails when asked. Its
 * timeout is Lambda's longest: the simulator enforces a function's timeout as Lambda does, on its
 * scaled clock, where a machine too busy to run a timer for a while lets simulated time run on. With
 * a minute, 4 of rate-limit.test.ts's 30 s bodies (at 50 times real time) timed out on a machine
 * loaded with three more busy processes than cores.
 */
export function workFunction(scope: Construct): lambda.Function {
  return new lambda.Function(scope, 'WorkFunction', {
    runtime: lambda.Runtime.NODEJS_18_X,
    handler: 'index.handler',
    timeout: Duration.minutes(15),
    code: lambda.Code.fromAsset(path.join(__dirname, 'work-function')),
  });
}

/**
 * The example app: a workflow that lets at most `limit` executions run the work at once. This is
 * what you would deploy; the demo runs it in the simulator instead.
 */
export function demoApp(limit: number, props: Partial<ConcurrencyControlledWorkflowProps> = {}) {
  const app = new App();
  const stack = new Stack(app, 'SemaphoreDemo');
  const work = new tasks.LambdaInvoke(stack, 'Run Work', { lambdaFunction: workFunction(stack), payloadResponseOnly: true });
  const workflow = new ConcurrencyControlledWorkflow(stack, 'Workflow', { body: work, concurrencyLimit: limit, lockName: 'demo', ...props });
  return { app, stack, workflow };
}
