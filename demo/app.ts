import * as path from 'path';
import { App, Stack } from 'aws-cdk-lib';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { Construct } from 'constructs';
import { ConcurrencyControlledWorkflow, ConcurrencyControlledWorkflowProps } from '../src';

/** The demo's unit of work: a Lambda function that takes `workSeconds` and fails when asked. */
export function workFunction(scope: Construct): lambda.Function {
  return new lambda.Function(scope, 'WorkFunction', {
    runtime: lambda.Runtime.NODEJS_18_X,
    handler: 'index.handler',
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
