import { App, Duration, Stack } from 'aws-cdk-lib';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { ConcurrencyControlledWorkflow, SemaphoreTable } from '../src';
import { runWorkflowScenario, WorkflowSimulator, workflowSubject } from '../testing';
import { until } from './helpers';

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

  test('runWorkflowScenario on a lock split by lockStripes holds each stripe to its share of `limit`', async () => {
    const stack = new Stack(new App(), 'Kit');
    const workflow = new ConcurrencyControlledWorkflow(stack, 'Workflow', {
      lockName: 'kit',
      concurrencyLimit: 6,
      lockStripes: 3,
      body: new sfn.Wait(stack, 'Work', { time: sfn.WaitTime.duration(Duration.seconds(10)) }),
    });
    const options = { executions: 18, limit: 6, timeScale: 0.02, workSeconds: 10, extendHorizon: true, seed: 3 };
    const result = await runWorkflowScenario(workflow, options);
    expect(result.invariantViolations).toEqual([]);
    expect(result.succeeded).toBe(18);
    expect(result.maxInside).toBeGreaterThan(2);
    // Told the whole limit is 3, each stripe is held to 1: the stripes' 2 are seen.
    const halved = await runWorkflowScenario(workflow, { ...options, limit: 3 });
    expect(halved.invariantViolations).toContainEqual(expect.stringMatching(/^kit#\d: 2 permits in use, limit 1$/));
  });

  test('WorkflowSimulator: the lock shows its holder and its waiter; the figures count the workflow and its cleanup', async () => {
    const stack = new Stack(new App(), 'Kit');
    const workflow = new ConcurrencyControlledWorkflow(stack, 'Workflow', {
      lockName: 'kit',
      body: new sfn.Wait(stack, 'Work', { time: sfn.WaitTime.duration(Duration.seconds(60)) }),
    });
    const sim = await WorkflowSimulator.start(workflow);
    try {
      const holder = sim.start({}, { name: 'holder' });
      await until(async () => (await sim.locks('kit'))[0]?.permitsInUse === 1, 'the holder to take the permit');
      const waiter = sim.start({}, { name: 'waiter' });
      await until(async () => (await sim.locks('kit'))[0]?.waiters.length === 1, 'the waiter to queue');
      const [lock] = await sim.locks('kit');
      expect([lock.holders, lock.waiters]).toEqual([[holder.arn], [waiter.arn]]);

      holder.abort(); // its cleanup frees the permit and hands it to the waiter
      await waiter.done;
      expect(waiter.status).toBe('SUCCEEDED');
      expect((await sim.locks('kit'))[0]).toEqual({ lockName: 'kit', permitsInUse: 0, holders: [], waiters: [] });
      const withCleanup = sim.figures([holder, waiter]);
      const cleanupUnits = [...sim.simulator.executions.values()].filter((e) => e !== holder && e !== waiter).reduce((n, e) => n + e.writeUnits, 0);
      expect(cleanupUnits).toBeGreaterThan(0);
      expect(withCleanup.writeUnits).toBeCloseTo((holder.writeUnits + waiter.writeUnits + cleanupUnits) / 2);
      expect(withCleanup.transitions).toBe((holder.transitions + waiter.transitions) / 2);
    } finally {
      await sim.stop();
    }
  });
});
