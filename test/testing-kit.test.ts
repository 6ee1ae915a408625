import { App, Stack } from 'aws-cdk-lib';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { ConcurrencyControlledWorkflow, SemaphoreTable } from '../src';
import { runWorkflowScenario, workflowSubject } from '../testing';

/*
 * cdk-sfn-semaphore/testing from the repository; test/packaged/run.ts runs the README's example of it
 * from the packed, installed package.
 */
describe('cdk-sfn-semaphore/testing', () => {
  test("finds the workflow's state machine, table and body states", () => {
    const stack = new Stack(new App(), 'Kit');
    const work = new sfn.Pass(stack, 'Prepare').next(new sfn.Pass(stack, 'Finish'));
    const workflow = new ConcurrencyControlledWorkflow(stack, 'Workflow', { body: work });
    const subject = workflowSubject(workflow);
    expect(subject.stateMachine).toBe(stack.getLogicalId(workflow.stateMachine.node.defaultChild as any));
    expect(subject.table).toBe(stack.getLogicalId(workflow.table.table.node.defaultChild as any));
    expect(subject.bodyStates.sort()).toEqual(['Finish', 'Prepare']);
  });

  test('refuses a table its stack does not define, and failures it cannot inject, saying why', async () => {
    const stack = new Stack(new App(), 'Kit');
    const imported = new ConcurrencyControlledWorkflow(stack, 'Imported', {
      table: SemaphoreTable.fromTableName(stack, 'Locks', 'locks'),
      lockName: 'l',
      body: new sfn.Pass(stack, 'Work'),
    });
    expect(() => workflowSubject(imported)).toThrow(/uses a table its stack does not define \(Kit\/Locks\)/);

    const own = new ConcurrencyControlledWorkflow(stack, 'Own', { body: new sfn.Pass(stack, 'Own Work') });
    await expect(runWorkflowScenario(own, { executions: 2, limit: 1, failureRate: 0.5 })).rejects.toThrow(
      /failureRate needs a handler of one of the body's Task states \(taskHandlers\), one of: Own Work/,
    );
  });
});
