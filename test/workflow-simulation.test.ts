import { createHash } from 'crypto';
import { DynamoDBClient, UpdateItemCommand } from '@aws-sdk/client-dynamodb';
import { App, CfnElement, Duration, Stack } from 'aws-cdk-lib';
import { Template } from 'aws-cdk-lib/assertions';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { ConcurrencyControlledWorkflow, RateLimit, SemaphoreTable, WaitStrategy } from '../src';
import { cleanupsEnded, lockState, logicalId, simulate, stateMachineLogicalId, statuses, until as waitUntil, WORK_FUNCTION_TIMEOUT, WorkTracker, workflowStack } from './helpers';
import { Execution, LockMonitor, metricFilterSums, seededRandom, Simulator, TaskContext, TaskError } from '../simulator';
import { executionHolderKey, HOLDER_REDRIVE_COUNT, isTicketKey, TICKET_SERVED_BY, TICKET_WAITER, ticketKey } from '../src/private/lock-schema';

/*
 * Executed behaviour: the synthesized workflow and cleanup state machines run in the local simulator
 * (aws-local-stepfunctions + dynalite), their status-change events routed through the synthesized
 * EventBridge rule. Durations are simulated seconds; the simulator runs them 100 times faster.
 */

const BODY_STATES = new Set(['Do Work']);

/** Execution ARNs of the test stack's workflow, without the execution name. */
/** The holder id of the test workflow's execution named `name`. */
const holderIdOf = (name: string) => executionHolderKey('arn:aws:states:us-east-1:123456789012:stateMachine:TestStack-WorkflowStateMachine8F1B1C15', name);

/** A DynamoDB client of the simulator's tables, for writes a test makes beside the state machines. */
function localDynamoDb(sim: Simulator): DynamoDBClient {
  return new DynamoDBClient({ endpoint: sim.db.endpoint, region: 'us-east-1', credentials: { accessKeyId: 'local', secretAccessKey: 'local' } });
}

/** Transitions outside the body. */
function overhead(e: Execution): number {
  return [...e.stateTransitions].filter(([name]) => !BODY_STATES.has(name)).reduce((sum, [, n]) => sum + n, 0);
}


function cleanupExecutions(sim: Simulator, workflow: ConcurrencyControlledWorkflow): Execution[] {
  const cleanup = sim.stateMachine(stateMachineLogicalId(workflow.cleanupStateMachine));
  return [...sim.executions.values()].filter((e) => e.stateMachine === cleanup);
}

describe('one execution', () => {
  test('uncontended: 3 transitions and 2 DynamoDB calls beside the body, the body output out, no permit left', async () => {
    const { stack, workflow, workFunctionId } = workflowStack();
    const work = new WorkTracker();
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));

      // First use of the lock (no item yet), then once the item exists.
      for (const run of [1, 2]) {
        const e = await sim.startExecution(sm, { order: run }).done;

        expect(e.status).toBe('SUCCEEDED');
        expect(e.output).toEqual({ worked: true, echo: { order: run } });
        expect(overhead(e)).toBe(3);
        expect(e.dynamoCalls).toBe(2);
        expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
      }
      await sim.idle();
      expect(cleanupExecutions(sim, workflow)).toHaveLength(0);
    });
  });

  test('a failing body: the permit comes back and the execution fails with the body error and cause', async () => {
    const { stack, workflow, workFunctionId } = workflowStack();
    const work = new WorkTracker();
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const e = await sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflow.stateMachine)), { fail: true }, { name: 'doomed' }).done;

      expect(e.status).toBe('FAILED');
      expect(e.error).toBe('WorkFailed');
      expect(JSON.parse(e.cause!)).toEqual({ errorType: 'WorkFailed', errorMessage: 'work failed for doomed', trace: [] });
      expect(e.stateTransitions.get('Release Permit After Failure')).toBe(1);
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
      await sim.idle();
      // The FAILED event reaches the cleanup, which finds nothing left to free.
      const [cleanup] = cleanupExecutions(sim, workflow);
      expect(cleanup.status).toBe('SUCCEEDED');
      expect(cleanup.stateTransitions.get('Permit Not Held')).toBe(1);
    });
  });

  test('a timed-out execution gets its permit freed by the cleanup', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ timeout: Duration.seconds(20) });
    const work = new WorkTracker(() => 100);
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const e = await sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflow.stateMachine))).done;
      await sim.idle();

      expect(e.status).toBe('TIMED_OUT');
      expect(e.stateTransitions.has('Release Permit')).toBe(false);
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
      // The cleanup found the permit still held, and freed it.
      const [cleanup] = cleanupExecutions(sim, workflow);
      expect(cleanup.status).toBe('SUCCEEDED');
      expect(cleanup.stateTransitions.get('Release Permit Of Stopped Execution')).toBe(1);
      expect(cleanup.stateTransitions.has('Permit Not Held')).toBe(false);
    });
  });
});

describe('the holder id', () => {
  test("an entry is named by the MD5 of the state machine's ARN and the execution's name; the cleanup finds it from the event", async () => {
    const { stack, workflow, workFunctionId } = workflowStack();
    const work = new WorkTracker(() => 100);
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const e = sim.startExecution(sm, {}, { name: 'keyed-by-name' });
      await waitUntil(() => work.byExecution.has(e.arn), 'the execution in its body');
      const item = (await sim.scan('WorkflowLockTable')).find((i) => i.lockName.S === 'TestStack/Workflow')!;
      // What States.Hash computed in the definition, against Node's own MD5.
      const key = `${createHash('md5').update(sm.arn, 'utf8').digest('hex')}:keyed-by-name`;
      expect(Object.keys(item).filter((k) => item[k].M !== undefined)).toEqual([key]);
      expect(e.holderId).toBe(key);
      expect(e.arn.length - key.length).toBe(48 + sm.name.length + 1 - 33);

      e.abort();
      await e.done;
      await sim.idle();
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
      const [cleanup] = cleanupExecutions(sim, workflow);
      expect(cleanup.stateTransitions.get('Release Permit Of Stopped Execution')).toBe(1);
      expect(cleanup.stateTransitions.has('Permit Not Held')).toBe(false);
    });
  });
});

describe.each([WaitStrategy.POLLING, WaitStrategy.QUEUE])('%s: 100 executions at limit 5, 10% body failures, 10% aborts inside the body', (waitStrategy) => {
  test.each([1, 2])('seed %i: never more than 5 inside, every failure explained, no permit left', async (seed) => {
    // No scheduled reconciler: under load a sweep can beat a cleanup to a stopped execution's permit,
    // and this test is about the cleanup.
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 5, waitStrategy, reconcilerScheduleEnabled: false });
    const random = seededRandom(seed);
    const inputs = Array.from({ length: 100 }, (_, i) => {
      const r = random();
      return { i, work: 12 + random() * 6, fail: r < 0.1, abortInside: r >= 0.1 && r < 0.2 };
    });
    const work = new WorkTracker((input) => input.work);
    await simulate(stack, { seed, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const monitor = new LockMonitor(sim, 'WorkflowLockTable', () => 5).start();
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));

      const executions = inputs.map((input) => sim.startExecution(sm, input));
      await Promise.all(executions.map((e) => e.done));
      await sim.idle();
      await monitor.stop();

      expect(work.maxInside).toBeLessThanOrEqual(5);
      expect(work.maxInside).toBe(5); // the lock really was contended
      expect(monitor.violations).toEqual([]);
      expect(monitor.samples).toBeGreaterThan(20);
      const expected = {
        FAILED: inputs.filter((i) => i.fail).length,
        ABORTED: inputs.filter((i) => i.abortInside).length,
        SUCCEEDED: inputs.filter((i) => !i.fail && !i.abortInside).length,
      };
      expect(expected.FAILED).toBeGreaterThan(0);
      expect(expected.ABORTED).toBeGreaterThan(0);
      expect(statuses(executions)).toEqual(expected);
      for (const e of executions.filter((x) => x.status === 'FAILED')) {
        expect([e.error, JSON.parse(e.cause!).errorMessage]).toEqual(['WorkFailed', `work failed for ${e.name}`]);
      }
      // Every execution ran the body exactly once.
      expect([...work.byExecution.values()].every((n) => n === 1)).toBe(true);
      expect(work.byExecution.size).toBe(100);

      // No permit is left: the aborted executions' permits were freed by the cleanup, started by the
      // synthesized rule, each one actually releasing.
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
      const cleanups = cleanupExecutions(sim, workflow);
      expect(cleanups).toHaveLength(expected.FAILED + expected.ABORTED);
      // A cleanup that handed the permit to a waiter whose wait had just timed out, and which the
      // waiter claimed before the cleanup could take it back, ends in "Permit Not Held" after waking it.
      const released = cleanups.filter(
        (c) => c.status === 'SUCCEEDED' && (!c.stateTransitions.has('Permit Not Held') || c.stateTransitions.has('Wake Next Waiter Of Stopped Execution')),
      );
      expect(released).toHaveLength(expected.ABORTED);
    });
  });
});

test('5% DynamoDB throttling fails no execution', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 5 });
  const work = new WorkTracker(() => 10);
  await simulate(stack, { seed: 3, dynamoFaults: { throttleRate: 0.05 }, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));

    const executions = Array.from({ length: 50 }, (_, i) => sim.startExecution(sm, { i }));
    await Promise.all(executions.map((e) => e.done));
    await sim.idle();

    expect(statuses(executions)).toEqual({ SUCCEEDED: 50 });
    // Throttling really happened, at about the injected rate.
    expect(sim.dynamo.throttled).toBeGreaterThan(5);
    expect(sim.dynamo.throttled / sim.dynamo.calls).toBeGreaterThan(0.02);
    expect(sim.dynamo.throttled / sim.dynamo.calls).toBeLessThan(0.1);
    expect(work.maxInside).toBe(5);
    expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
  });
});

test.each([WaitStrategy.POLLING, WaitStrategy.QUEUE])('%s: server errors after the write landed neither leak a permit nor leave an execution waiting for itself', async (waitStrategy) => {
  const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 3, waitStrategy });
  const work = new WorkTracker(() => 10);
  // 30%: so that some of the ~30 successful acquires surely get the error, whatever order the draws come in.
  const options = { seed: 4, dynamoFaults: { serverErrorAfterWriteRate: 0.3 }, lambdaHandlers: { [workFunctionId]: work.handler } };
  await simulate(stack, options, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));

    const executions = Array.from({ length: 30 }, (_, i) => sim.startExecution(sm, { i }));
    await Promise.all(executions.map((e) => e.done));
    await sim.idle();

    expect(statuses(executions)).toEqual({ SUCCEEDED: 30 });
    // An acquire whose response was lost is retried; the retry finds the execution's own entry and claims it.
    const claimed = executions.filter((e) => e.stateTransitions.has('Claim Own Permit') || e.stateTransitions.has('Claim Own Permit While Polling'));
    expect(claimed.length).toBeGreaterThan(0);
    expect(work.maxInside).toBeLessThanOrEqual(3);
    expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
  });
});

describe('lock name and limit from the execution input', () => {
  test('each lock keeps its own limit, and the cleanup frees permits of aborted executions', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({
      lockName: sfn.JsonPath.stringAt('$.tenant'),
      concurrencyLimit: sfn.JsonPath.numberAt('$.limit'),
    });
    const insideByLock = new Map<string, { now: number; max: number }>();
    const work = new WorkTracker(() => 8);
    const tracked = async (input: any, context: any) => {
      const s = insideByLock.get(input.tenant) ?? { now: 0, max: 0 };
      insideByLock.set(input.tenant, s);
      s.now++;
      s.max = Math.max(s.max, s.now);
      try {
        return await work.handler(input, context);
      } finally {
        s.now--;
      }
    };
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: tracked } }, async (sim) => {
      const limits: Record<string, number> = { alpha: 2, beta: 3 };
      const monitor = new LockMonitor(sim, 'WorkflowLockTable', (name) => limits[name]).start();
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));

      const executions = Array.from({ length: 24 }, (_, i) => {
        const tenant = i % 2 === 0 ? 'alpha' : 'beta';
        return sim.startExecution(sm, { tenant, limit: limits[tenant], abortInside: i % 6 === 1 });
      });
      await Promise.all(executions.map((e) => e.done));
      await sim.idle();
      await monitor.stop();

      expect(insideByLock.get('alpha')!.max).toBe(2);
      expect(insideByLock.get('beta')!.max).toBe(3);
      expect(monitor.violations).toEqual([]);
      expect(statuses(executions)).toEqual({ SUCCEEDED: 20, ABORTED: 4 });
      expect((await lockState(sim)).sort((a, b) => a.lockName.localeCompare(b.lockName))).toEqual([
        { lockName: 'alpha', permitsInUse: 0, holders: [] },
        { lockName: 'beta', permitsInUse: 0, holders: [] },
      ]);
    });
  });

  test('the cleanup reads the lock name through DescribeExecution when the event leaves the input out', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ lockName: sfn.JsonPath.stringAt('$.tenant') });
    const work = new WorkTracker(() => 1);
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      // An input above 248 KiB does not fit in the status-change event.
      const e = await sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflow.stateMachine)), {
        tenant: 'big',
        abortInside: true,
        padding: 'x'.repeat(250 * 1024),
      }).done;
      await sim.idle();

      expect(e.status).toBe('ABORTED');
      const [cleanup] = cleanupExecutions(sim, workflow);
      expect(cleanup.stateTransitions.get('Describe Stopped Execution')).toBe(1);
      expect(await lockState(sim)).toEqual([{ lockName: 'big', permitsInUse: 0, holders: [] }]);
    });
  });

  test('an input too large for DescribeExecution to return leaves the permit to the sweep, and the cleanup succeeds', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ lockName: sfn.JsonPath.stringAt('$.tenant') });
    const work = new WorkTracker(() => 1);
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      // Just under the 256 KiB input quota: DescribeExecution's result (the input and the other fields) is over it.
      const padding = 'x'.repeat(256 * 1024 - 100);
      const e = await sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflow.stateMachine)), { tenant: 'huge', abortInside: true, padding }).done;
      await sim.idle();

      expect(e.status).toBe('ABORTED');
      const [cleanup] = cleanupExecutions(sim, workflow);
      expect(cleanup.status).toBe('SUCCEEDED');
      expect(cleanup.stateTransitions.get('Input Too Large: Left To The Sweep')).toBe(1);
      expect(await lockState(sim)).toEqual([{ lockName: 'huge', permitsInUse: 1, holders: [e.arn] }]);

      // The sweep leaves a holder alone for its first minute (GRACE_MS): eventually consistent reads.
      await sim.sleep(60);
      await sim.fireScheduledRules();
      expect(await lockState(sim)).toEqual([{ lockName: 'huge', permitsInUse: 0, holders: [] }]);
    });
  });

  test('the cleanup ignores events of other statuses, and frees the first run\'s permit on an event without redriveCount', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 2 });
    const work = new WorkTracker((input) => input.seconds);
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const holder = sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflow.stateMachine)), { seconds: 100 });
      await waitUntil(() => work.byExecution.has(holder.arn), 'the holder in its body');
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 1, holders: [holder.arn] }]);
      const cleanup = sim.stateMachine(stateMachineLogicalId(workflow.cleanupStateMachine));
      const event = (detail: Record<string, unknown>) => ({
        'detail-type': 'Step Functions Execution Status Change',
        'source': 'aws.states',
        'detail': { executionArn: holder.arn, stateMachineArn: holder.stateMachine.arn, input: '{}', ...detail },
      });

      // Started by hand (the rule lets only stopped statuses through): a status it does not know, none, or not a string.
      for (const detail of [{ status: 'RUNNING' }, { status: 'PENDING_REDRIVE' }, { status: 'SOMETHING_NEW' }, {}, { status: 7 }]) {
        const ignored = await sim.startExecution(cleanup, event({ ...detail, redriveCount: 0 })).done;
        expect([detail, ignored.status, ignored.stateTransitions.get('Not A Stopped Execution')]).toEqual([detail, 'SUCCEEDED', 1]);
        expect(ignored.dynamoCalls).toBe(0);
      }
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 1, holders: [holder.arn] }]);

      // An event without a numeric redriveCount is of the first run: it frees that run's permit (once).
      for (const redriveCount of [undefined, null, '0']) {
        const freed = await sim.startExecution(cleanup, event({ status: 'ABORTED', redriveCount })).done;
        expect([freed.status, freed.error, freed.cause]).toEqual(['SUCCEEDED', undefined, undefined]);
        expect(freed.stateTransitions.get('Redrive Count Missing: First Run')).toBe(1);
      }
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
      holder.abort();
    });
  });

  test.each([
    [{ limit: 0 }, 'got: 0'],
    [{ limit: -2 }, 'got: -2'],
    [{ limit: 'five' }, 'got: "five"'],
    [{}, 'got none'],
    [{ limit: 1001 }, 'got: 1001'],
  ])(
    'a runtime limit that is not a number from 1 to 1000 fails with SemaphoreInvalidLimit, holding nothing, quoting it: %j',
    async (input, got) => {
      const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: sfn.JsonPath.numberAt('$.limit') });
      const work = new WorkTracker();
      await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
        const e = await sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflow.stateMachine)), input).done;

        expect([e.status, e.error]).toEqual(['FAILED', 'SemaphoreInvalidLimit']);
        expect(e.cause).toBe(`The concurrency limit read from the execution input at $.limit must be a number from 1 to 1000, ${got}`);
        expect(e.dynamoCalls).toBe(0);
        expect(work.runs).toBe(0);
        // The bound itself is allowed.
        const ok = await sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflow.stateMachine)), { limit: 1000 }).done;
        expect([ok.status, work.runs]).toEqual(['SUCCEEDED', 1]);
      });
    },
  );
  test('a limit and a weight at bracketed paths: the causes quote the paths as written', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({
      concurrencyLimit: sfn.JsonPath.numberAt("$['limit']"),
      permits: sfn.JsonPath.numberAt("$['job']['weight']"),
    });
    const work = new WorkTracker();
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const badLimit = await sim.startExecution(sm, { limit: 'five', job: { weight: 1 } }).done;
      expect([badLimit.status, badLimit.error]).toEqual(['FAILED', 'SemaphoreInvalidLimit']);
      expect(badLimit.cause).toBe("The concurrency limit read from the execution input at $['limit'] must be a number from 1 to 1000, got: \"five\"");
      const badWeight = await sim.startExecution(sm, { limit: 2, job: { weight: 3 } }).done;
      expect([badWeight.status, badWeight.error]).toEqual(['FAILED', ConcurrencyControlledWorkflow.INVALID_PERMITS_ERROR]);
      expect(badWeight.cause).toBe("The permits read from the execution input at $['job']['weight'] must be at most the concurrency limit read from it at $['limit'], got: 3 and 2");
      const ok = await sim.startExecution(sm, { limit: 2, job: { weight: 2 } }).done;
      expect([ok.status, work.runs]).toEqual(['SUCCEEDED', 1]);
    });
  });

  test.each([[{ tenant: 'a\u001f1' }], [{ tenant: '' }], [{ tenant: 7 }], [{}]])(
    'a runtime lock name that is missing, not a string, empty or has U+001F fails with SemaphoreInvalidLockName: %j',
    async (input) => {
      const { stack, workflow, workFunctionId } = workflowStack({ lockName: sfn.JsonPath.stringAt('$.tenant') });
      const work = new WorkTracker();
      await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
        const e = await sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflow.stateMachine)), input).done;

        expect([e.status, e.error]).toEqual(['FAILED', ConcurrencyControlledWorkflow.INVALID_LOCK_NAME_ERROR]);
        expect(e.dynamoCalls).toBe(0);
        expect(work.runs).toBe(0);
        // A valid name passes the check: one transition more, only for a lock name from the input.
        const ok = await sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflow.stateMachine)), { tenant: 'a' }).done;
        expect(ok.status).toBe('SUCCEEDED');
        expect(ok.stateTransitions.get('Check Runtime Lock Name')).toBe(1);
      });
    },
  );
});

test('the acquire timeout fails a waiting execution with SemaphoreAcquireTimeout', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({ acquireTimeout: Duration.seconds(30) });
  const work = new WorkTracker((input) => input.seconds);
  await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const holder = sim.startExecution(sm, { seconds: 100 }, { name: 'holder' });
    await waitUntil(() => work.byExecution.has(holder.arn), 'the holder in its body');

    const waiter = await sim.startExecution(sm, { seconds: 1 }, { name: 'waiter' }).done;

    expect([waiter.status, waiter.error]).toEqual(['FAILED', 'SemaphoreAcquireTimeout']);
    const waited = (waiter.stopDate! - waiter.startDate) / 1000;
    expect(waited).toBeGreaterThanOrEqual(30);
    expect(waited).toBeLessThan(60);
    expect(work.byExecution.has(waiter.arn)).toBe(false);
    expect((await holder.done).status).toBe('SUCCEEDED');
    await sim.idle();
    expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
  });
});

test('with an acquire timeout, a waiter that gets a permit in time runs normally', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({ acquireTimeout: Duration.seconds(60), concurrencyLimit: 2 });
  const work = new WorkTracker(() => 10);
  await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));

    const executions = Array.from({ length: 6 }, (_, i) => sim.startExecution(sm, { i }));
    await Promise.all(executions.map((e) => e.done));

    expect(statuses(executions)).toEqual({ SUCCEEDED: 6 });
    expect(executions.filter((e) => e.stateTransitions.has('Permit Acquired')).length).toBeGreaterThan(0);
    expect(executions.map((e) => e.output)).toEqual(executions.map((_, i) => ({ worked: true, echo: { i } })));
    expect(work.maxInside).toBe(2);
  });
});

test('workflows sharing a table and lock name share its permits', async () => {
  const stack = new Stack(new App(), 'Shared');
  const table = new SemaphoreTable(stack, 'Locks');
  const fn = new lambda.Function(stack, 'WorkFunction', {
    runtime: lambda.Runtime.NODEJS_18_X,
    handler: 'index.handler',
    code: lambda.Code.fromInline('exports.handler = async () => ({});'),
    timeout: WORK_FUNCTION_TIMEOUT,
  });
  const workflows = ['First', 'Second'].map(
    (id) =>
      new ConcurrencyControlledWorkflow(stack, id, {
        table,
        lockName: 'shared',
        concurrencyLimit: 2,
        body: new tasks.LambdaInvoke(stack, `${id} Work`, { lambdaFunction: fn, payloadResponseOnly: true }),
      }),
  );
  const work = new WorkTracker(() => 5);
  await simulate(stack, { lambdaHandlers: { [logicalId(fn.node.defaultChild as CfnElement)]: work.handler } }, async (sim) => {
    const monitor = new LockMonitor(sim, 'Locks', () => 2).start();

    const executions = workflows.flatMap((w) =>
      Array.from({ length: 8 }, (_, i) => sim.startExecution(sim.stateMachine(stateMachineLogicalId(w.stateMachine)), { i })),
    );
    await Promise.all(executions.map((e) => e.done));
    await monitor.stop();

    expect(statuses(executions)).toEqual({ SUCCEEDED: 16 });
    // Never more than the limit inside; that the lock was full shows in its permits, held through hand-offs
    // (two 5 s bodies, 50 ms of real time each, need not overlap on a loaded machine).
    expect(work.maxInside).toBeLessThanOrEqual(2);
    expect(monitor.maxPermits).toBe(2);
    expect(monitor.violations).toEqual([]);
    expect(await lockState(sim, 'Locks')).toEqual([{ lockName: 'shared', permitsInUse: 0, holders: [] }]);
  });
});

test('a duplicated status-change event never frees a permit twice', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 2 });
  const work = new WorkTracker((input) => input.seconds);
  await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    sim.eventFaults = { duplicateRate: 1 };
    const aborted = await sim.startExecution(sm, { seconds: 1, abortInside: true }).done;
    await sim.idle();
    expect(cleanupExecutions(sim, workflow)).toHaveLength(2); // delivered twice, freed once
    expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);

    // Two other executions now hold both permits (for 600 s, which outlasts two cleanups however slow
    // the machine); the stale event arrives again, twice more.
    const holders = [sim.startExecution(sm, { seconds: 600 }), sim.startExecution(sm, { seconds: 600 })];
    // Waited for, not timed (a busy machine stretches the simulated seconds the states and the cleanups take).
    await waitUntil(() => holders.every((h) => work.byExecution.has(h.arn)), 'both holders in their body');
    const abortEvent = sim.events.find((ev) => ev.detail.executionArn === aborted.arn && ev.detail.status === 'ABORTED')!;
    sim.putEvent(abortEvent);
    // Delivered twice again: two more cleanups, run to their end.
    await cleanupsEnded(sim, aborted, 4);

    const state = await lockState(sim);
    expect(state).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 2, holders: expect.arrayContaining(holders.map((h) => h.arn)) }]);
    expect(work.inside).toBe(2);
    await Promise.all(holders.map((h) => h.done));
    expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
  });
});

/** Bodies that hold executions of these names inside until the test calls `finish.get(name)`. */
function heldBodies(names: string[]) {
  const finish = new Map<string, () => void>();
  const body = async (_input: any, context: TaskContext) => {
    if (names.includes(context.execution.name)) await new Promise<void>((resolve) => finish.set(context.execution.name, resolve));
    return { done: true };
  };
  return { finish, body };
}

/** Questions on the workflow's lock item about the execution named `name`, and a wait until one holds. */
function lockProbes(sim: () => Simulator) {
  const items = async () => sim().scan('WorkflowLockTable');
  const item = async () => (await items()).find((i) => i.lockName.S === 'TestStack/Workflow');
  return {
    holds: async (name: string) => (await item())?.[holderIdOf(name)] !== undefined,
    // Waiting on a ticket: its ticket item names it and is not served yet.
    queued: async (name: string) =>
      (await items()).some((i) => isTicketKey(i.lockName.S!) && i[TICKET_WAITER]?.S === holderIdOf(name) && i[TICKET_SERVED_BY] === undefined),
    // Bounded in real time, and failing past it (as the helpers' until): a busy machine makes the condition slower to hold.
    until: async (condition: () => Promise<boolean>) => {
      const end = Date.now() + 20_000;
      while (!(await condition())) {
        if (Date.now() > end) throw new Error('timed out waiting for a lock probe');
        await sim().sleep(0.5);
      }
    },
  };
}

/** A DynamoDB UpdateItem task's own call, for task handlers that act around it. */
const updateItem = (input: any, context: TaskContext) => context.simulator.dynamo.run('arn:aws:states:::dynamodb:updateItem', input);

describe('payload edges: the release needs 4 KiB beside the body\'s output', () => {
  // The body returns `bytes` of output; the release keeps its holder, and a hand-off the ticket it serves
  // (with the waiter's task token, up to 2,048 characters on AWS), beside it in the state data.
  const outputOf = (bytes: number) => ({ pad: 'x'.repeat(bytes - 10) });
  test('an output of 252 KiB comes through a hand-off; one at 256 KiB fails with States.DataLimitExceeded, and its permit is still freed', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 1 });
    const work = new WorkTracker(() => 2);
    // The first body in stays inside until the other execution waits on its ticket (however slow the
    // machine), so that its release hands the permit over.
    let gated = false;
    const handler = async (input: any, context: TaskContext) => {
      if (!gated) {
        gated = true;
        const queued = async () => (await context.simulator.scan('WorkflowLockTable')).some((i) => isTicketKey(i.lockName.S!) && i[TICKET_WAITER] !== undefined);
        await waitUntil(queued, 'the second execution to wait on its ticket');
      }
      await work.handler(input, context);
      return outputOf(input.bytes);
    };
    // Task tokens of AWS's longest, 2,048 characters.
    await simulate(stack, { taskTokenLength: 2048, lambdaHandlers: { [workFunctionId]: handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      // Two at once: the first hands its permit to the second.
      const fits = [sim.startExecution(sm, { bytes: 252 * 1024 }), sim.startExecution(sm, { bytes: 252 * 1024 })];
      await Promise.all(fits.map((e) => e.done));
      expect(statuses(fits)).toEqual({ SUCCEEDED: 2 });
      expect(fits.map((e) => e.stateTransitions.get('Wake Next Waiter') ?? 0).reduce((a, b) => a + b)).toBe(1);
      expect(Buffer.byteLength(JSON.stringify(fits[1].output))).toBe(252 * 1024);

      // Under the limit on its own, over it with the release's holder id (about 40 characters here) and run beside it.
      const tooLarge = await sim.startExecution(sm, { bytes: 256 * 1024 - 40 }).done;
      await sim.idle();
      expect([tooLarge.status, tooLarge.error]).toEqual(['FAILED', 'States.DataLimitExceeded']);
      // States.ALL does not catch it: the in-band release may not run, and the cleanup frees the permit.
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    });
  });
});

describe('history budget: a wait gives up with SemaphoreAcquireTimeout well before 25,000 history events, holding nothing', () => {
  // The queue counts its rounds' events; polling's timer allows as many polls as fit if each took only
  // pollInterval (each also takes its call's time, so fewer happen).
  // (A poll's CPU time passes as simulated time too, 500 times over at this time scale: on a busy
  // machine fewer polls fit in the timer, hence polling's lower floor.)
  test.each([
    [WaitStrategy.QUEUE, { queueCheckInterval: Duration.seconds(1) }, 'Wait Budget Spent', 17_000],
    [WaitStrategy.POLLING, { pollInterval: Duration.seconds(1) }, 'Acquire Timed Out', 2_000],
  ])('%s', async (waitStrategy, intervals, endState, leastEvents) => {
    const { stack, workflow } = workflowStack({ concurrencyLimit: 1, waitStrategy, ...intervals, reconcilerScheduleEnabled: false });
    // The holder outlasts the waiter's whole budget: its body (longer than a Lambda function may run,
    // so the task itself is replaced, as a job run with .sync would take that long) ends only once the
    // waiter has given up.
    let waiterDone = false;
    const work = new WorkTracker((input) => input.seconds);
    const body = async (input: any, context: TaskContext) => {
      if (input.holder) await waitUntil(() => waiterDone, 'the waiter to give up', 240_000);
      return work.handler(input, context);
    };
    await simulate(stack, { timeScale: 0.002, taskHandlers: { 'Do Work': body } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const holder = sim.startExecution(sm, { seconds: 1, holder: true });
      await waitUntil(() => holder.stateTransitions.has('Do Work'), 'the holder in its body');
      const waiter = await sim.startExecution(sm, { seconds: 1 }).done;

      expect([waiter.status, waiter.error]).toEqual(['FAILED', ConcurrencyControlledWorkflow.ACQUIRE_TIMEOUT_ERROR]);
      expect(waiter.stateTransitions.get(endState)).toBe(1);
      // It spent at most its budget (18,000 events of waiting) and the release path, far from the limit.
      expect(waiter.historyEvents).toBeGreaterThan(leastEvents);
      expect(waiter.historyEvents).toBeLessThan(18_100);
      // It waited about workflow.longestWait (1 s rounds), and never ran the body.
      const waited = (waiter.stopDate! - waiter.startDate) / 1000;
      expect(waited).toBeGreaterThan(0.9 * workflow.longestWait!.toSeconds());
      expect(work.byExecution.get(waiter.arn)).toBeUndefined();
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 1, holders: [holder.arn] }]);

      // The holder's release skips the abandoned ticket: nothing is left held.
      waiterDone = true;
      await holder.done;
      await sim.idle();
      expect(holder.status).toBe('SUCCEEDED');
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    });
  }, 300_000);
});

/**
 * A holder in its body (100 s) and a waiter in the queue; then the holder's permit is freed behind the
 * queue's back (as an operator's force-release would), so the waiter finds it by polling once its wait
 * times out.
 */
async function queueBesideFreedPermit(sim: Simulator, workflow: ConcurrencyControlledWorkflow): Promise<{ holder: Execution; waiter: Execution }> {
  const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
  const holder = sim.startExecution(sm, { seconds: 100 }, { name: 'holder' });
  await waitUntil(() => holder.stateTransitions.has('Do Work'), 'the holder in its body');
  const waiter = sim.startExecution(sm, { seconds: 5 }, { name: 'waiter' });
  await waitUntil(() => waiter.stateTransitions.get('Wait In Queue') === 1, 'the waiter in the queue');
  await localDynamoDb(sim).send(
    new UpdateItemCommand({
      TableName: sim.tableName('WorkflowLockTable'),
      Key: { lockName: { S: 'TestStack/Workflow' } },
      UpdateExpression: 'SET permitsInUse = permitsInUse - :one REMOVE #holder',
      ExpressionAttributeNames: { '#holder': holder.holderId },
      ExpressionAttributeValues: { ':one': { N: '1' } },
    }),
  );
  return { holder, waiter };
}

describe('the queue', () => {
  test('waiters are admitted in arrival order, each woken with a fencing token that strictly increases', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 1, waitStrategy: WaitStrategy.QUEUE, permitPath: '$.permit' });
    const tokens: Array<[string, number]> = [];
    const work = new WorkTracker(() => 10);
    const executions: Execution[] = [];
    const queued = (e: Execution) => e.stateTransitions.get('Wait In Queue') === 1;
    const tracked = async (input: any, context: any) => {
      tokens.push([context.execution.name, input.permit.fencingToken]);
      // The first holds the permit until all five wait (a fixed head start could run out on a busy machine).
      if (context.execution.name === 'e0') await waitUntil(() => executions.length === 6 && executions.slice(1).every(queued), 'five queued');
      return work.handler(input, context);
    };
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: tracked } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      // One at a time, each started once the one before is in the body or the queue, so that the
      // arrival order is known.
      for (let i = 0; i < 6; i++) {
        const e = sim.startExecution(sm, { i }, { name: `e${i}` });
        executions.push(e);
        await waitUntil(() => (i === 0 ? tokens.length === 1 : queued(e)), `e${i} in the body or the queue`);
      }
      await Promise.all(executions.map((e) => e.done));
      await sim.idle();

      expect(statuses(executions)).toEqual({ SUCCEEDED: 6 });
      expect(tokens.map(([name]) => name)).toEqual(['e0', 'e1', 'e2', 'e3', 'e4', 'e5']);
      const fences = tokens.map(([, token]) => token);
      expect(fences.every((t, i) => i === 0 || t > fences[i - 1])).toBe(true);
      // Waiters slept: no polls; each was woken by the release before it. What the README's cost table
      // says: a waiter enters the Parallel, takes a ticket and waits (two writes); a release that hands
      // off claims, serves (deleting the ticket's item, which finds the waiter), hands off and wakes beside its refused give-back.
      expect(executions.filter((e) => e.stateTransitions.has('Poll For Permit'))).toEqual([]);
      for (const waiter of executions.slice(1)) {
        expect(['Wait For Permit', 'Take Ticket', 'Wait In Queue'].map((s) => waiter.stateTransitions.get(s))).toEqual([1, 1, 1]);
      }
      const handOff = ['Release Permit', 'Peek At Next Waiter', 'Serve Ticket', 'Hand Off Permit', 'Wake Next Waiter'];
      for (const releaser of executions.slice(0, 5)) {
        expect(handOff.map((s) => releaser.stateTransitions.get(s))).toEqual([1, 1, 1, 1, 1]);
        // The rare paths of a ticket without a waiter are not taken.
        expect(['Mark Ticket Served', 'Read Served Ticket', 'Check Ticket'].filter((s) => releaser.stateTransitions.has(s))).toEqual([]);
      }
      // The last release finds nobody waiting: one write.
      expect(executions[5].stateTransitions.has('Peek At Next Waiter')).toBe(false);
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    });
  });

  test('waiters whose input is not an object (a string, an array) wait and run with their input unchanged', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 1, waitStrategy: WaitStrategy.QUEUE });
    const inputs: unknown[] = [];
    const body = async (input: any, context: TaskContext) => {
      inputs.push(input);
      // Long enough that the holder is still inside once the test sees it there (it looks every 50 ms, 5 s here).
      await context.simulator.sleep(30, context.signal);
      return { ok: true };
    };
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: body } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const holder = sim.startExecution(sm, 'first');
      await waitUntil(() => inputs.length === 1, 'the holder in its body');
      const waiters = [sim.startExecution(sm, 'a string'), sim.startExecution(sm, [1, 2])];
      await Promise.all([holder.done, ...waiters.map((w) => w.done)]);

      expect([holder, ...waiters].map((e) => e.status)).toEqual(['SUCCEEDED', 'SUCCEEDED', 'SUCCEEDED']);
      expect(waiters.every((w) => w.stateTransitions.get('Wait In Queue') === 1)).toBe(true);
      // Woken in their first wait, outside the Parallel: the ticket replaced their state data, and the
      // body had the execution's input from the context, as it came.
      expect(waiters.map((w) => w.stateTransitions.has('Wait For Permit'))).toEqual([false, false]);
      expect(inputs.slice(1)).toEqual(expect.arrayContaining(['a string', [1, 2]]));
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    });
  });

  test('a first wait that ends other than woken goes on in the Parallel where it would have, and the body gets the execution input', async () => {
    // Limit 1, a 30 s check interval, every wake-up lost. H holds; R's ticket is refused (H gave its
    // permit back meanwhile: R polls it); T sleeps on its ticket, its wake-up is lost, and it finds its
    // handed-off permit when its wait times out. Their inputs carry the queue's own field names.
    const props = { concurrencyLimit: 1, waitStrategy: WaitStrategy.QUEUE, queueCheckInterval: Duration.seconds(30) };
    const { stack, workflow, workFunctionId } = workflowStack(props);
    const { finish, body: held } = heldBodies(['H', 'R']);
    const inputs = new Map<string, unknown>();
    const body = async (input: any, context: TaskContext) => {
      inputs.set(context.execution.name, input);
      return held(input, context);
    };
    let sim!: Simulator;
    let hDone = false;
    const taskHandlers = {
      // R's ticket comes after H's release: the lock is no longer full, and the ticket is refused.
      'Take Ticket': async (input: any, context: TaskContext) => {
        if (context.execution.name === 'R') {
          finish.get('H')!();
          await waitUntil(() => hDone, 'H released');
        }
        return updateItem(input, context);
      },
    };
    sim = await Simulator.start(stack, { lostWakeUpRate: 1, taskHandlers, lambdaHandlers: { [workFunctionId]: body } });
    try {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const h = sim.startExecution(sm, { who: 'H' }, { name: 'H' });
      void h.done.then(() => (hDone = true));
      await waitUntil(() => inputs.has('H'), 'H in its body');
      const rInput = { who: 'R', semaphoreTicket: 'theirs', ticket: [1] };
      const r = sim.startExecution(sm, rInput, { name: 'R' });
      await waitUntil(() => inputs.has('R'), 'R in its body');
      const tInput = { who: 'T', timedOut: true, refused: 'x', semaphoreWait: 1 };
      const t = sim.startExecution(sm, tInput, { name: 'T' });
      // Its ticket item written (not just the state entered): R's release then hands off to it.
      const { queued, until: untilProbe } = lockProbes(() => sim);
      await untilProbe(() => queued('T'));
      finish.get('R')!();
      await Promise.all([h.done, r.done, t.done]);
      await sim.idle();

      expect([h.status, r.status, t.status]).toEqual(['SUCCEEDED', 'SUCCEEDED', 'SUCCEEDED']);
      // R: refused ticket, then the Parallel from Poll For Permit.
      const rPath = ['Take Ticket', 'Wait For Permit', 'Resume Wait', 'Poll For Permit'];
      expect(rPath.map((s) => r.stateTransitions.get(s))).toEqual([1, 1, 1, 1]);
      expect(r.stateTransitions.has('Wait In Queue')).toBe(false);
      // T: its wait timed out (R handed it the permit, the wake-up lost), then the Parallel on its ticket.
      expect(sim.lostWakeUps).toBe(1);
      const tPath = ['Take Ticket', 'Wait In Queue', 'Wait For Permit', 'Resume Wait', 'Poll For Permit Again'];
      expect(tPath.map((s) => t.stateTransitions.get(s))).toEqual([1, 1, 1, 1, 1]);
      expect(t.stateTransitions.get('Check Handed-Off Permit Again')).toBe(1);
      // Whatever the way in, the body had the execution's input, and the output is the body's.
      expect([inputs.get('H'), inputs.get('R'), inputs.get('T')]).toEqual([{ who: 'H' }, rInput, tInput]);
      expect([r.output, t.output]).toEqual([{ done: true }, { done: true }]);
      // The log's Waits metric counts each wait once, in its Take Ticket (the Parallel is not entered by every wait).
      expect(metricFilterSums(Template.fromStack(stack).toJSON(), [h, r, t])).toMatchObject({ Acquisitions: 3, Waits: 2 });
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    } finally {
      await sim.stop();
    }
  });

  test('lost wake-ups: every waiter finds its handed-off permit when its wait times out, and nothing leaks', async () => {
    const props = { concurrencyLimit: 2, waitStrategy: WaitStrategy.QUEUE, queueCheckInterval: Duration.seconds(30) };
    const { stack, workflow, workFunctionId } = workflowStack(props);
    const work = new WorkTracker(() => 5);
    await simulate(stack, { lostWakeUpRate: 1, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const monitor = new LockMonitor(sim, 'WorkflowLockTable', () => 2).start();
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const executions = Array.from({ length: 8 }, (_, i) => sim.startExecution(sm, { i }));
      await Promise.all(executions.map((e) => e.done));
      await sim.idle();
      await monitor.stop();

      expect(statuses(executions)).toEqual({ SUCCEEDED: 8 });
      expect(sim.lostWakeUps).toBeGreaterThan(0);
      // Never more than the limit inside; that the lock was full shows in its permits, held through hand-offs
      // (two 5 s bodies, 50 ms of real time each, need not overlap on a loaded machine).
      expect(work.maxInside).toBeLessThanOrEqual(2);
      expect(monitor.maxPermits).toBe(2);
      expect(monitor.violations).toEqual([]);
      // The waiters whose wake-up was lost found their permit when their wait timed out: the renewal
      // of their wait was refused (they held a permit), and the check claimed it.
      expect(executions.filter((e) => e.stateTransitions.has('Check Handed-Off Permit Again')).length).toBeGreaterThan(0);
      // Nothing for the reconciler: no permit was handed to an entry nobody would claim (an execution
      // that gets in by polling or by its check gives up its wait token, and its entry is dropped).
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    });
  });

  test('a throttled wake-up (Sfn.SfnException): a heartbeat finds the waiter still waiting, and it is woken again at once', async () => {
    // A check interval longer than the whole run: a wake-up left to it would show in the drain.
    const props = { concurrencyLimit: 2, waitStrategy: WaitStrategy.QUEUE, queueCheckInterval: Duration.hours(1) };
    const { stack, workflow, workFunctionId } = workflowStack(props);
    const work = new WorkTracker(() => 5);
    // Every first wake-up is throttled, as AWS reports it to an AWS SDK integration; the heartbeat and the second one are not.
    const throttled = async () => {
      throw new TaskError('Sfn.SfnException', 'Rate exceeded (Service: Sfn, Status Code: 400)');
    };
    const options = { lambdaHandlers: { [workFunctionId]: work.handler }, taskHandlers: { 'Wake Next Waiter': throttled } };
    await simulate(stack, options, async (sim) => {
      const monitor = new LockMonitor(sim, 'WorkflowLockTable', () => 2).start();
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const started = sim.now();
      const executions = Array.from({ length: 10 }, (_, i) => sim.startExecution(sm, { i }));
      await Promise.all(executions.map((e) => e.done));
      await sim.idle();
      await monitor.stop();

      expect(statuses(executions)).toEqual({ SUCCEEDED: 10 });
      // Never more than the limit inside; that the lock was full shows in its permits, held through hand-offs
      // (two 5 s bodies, 50 ms of real time each, need not overlap on a loaded machine).
      expect(work.maxInside).toBeLessThanOrEqual(2);
      expect(monitor.maxPermits).toBe(2);
      expect(monitor.violations).toEqual([]);
      const count = (state: string) => executions.reduce((n, e) => n + (e.stateTransitions.get(state) ?? 0), 0);
      // Eight waiters, each handed a permit, each first wake-up throttled, confirmed and sent again.
      expect([count('Wake Next Waiter'), count('Is Waiter Still Waiting'), count('Wake Next Waiter Again'), count('Wake-Up Lost')]).toEqual([8, 8, 8, 0]);
      // No waiter slept its hour: five rounds of 5 s bodies and their states took about a minute.
      expect((sim.now() - started) / 1000).toBeLessThan(300);
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    });
  });

  test('throttled Step Functions calls (40% of all): never more than the limit inside, nothing leaks', async () => {
    const props = { concurrencyLimit: 2, waitStrategy: WaitStrategy.QUEUE, queueCheckInterval: Duration.seconds(30) };
    const { stack, workflow, workFunctionId } = workflowStack(props);
    const work = new WorkTracker(() => 5);
    await simulate(stack, { sfnThrottleRate: 0.4, seed: 3, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const monitor = new LockMonitor(sim, 'WorkflowLockTable', () => 2).start();
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const executions = Array.from({ length: 20 }, (_, i) => sim.startExecution(sm, { i }));
      await Promise.all(executions.map((e) => e.done));
      await sim.idle();
      await monitor.stop();

      expect(statuses(executions)).toEqual({ SUCCEEDED: 20 });
      expect(sim.throttledSfnCalls).toBeGreaterThan(0);
      // Never more than the limit inside; that the lock was full shows in its permits, held through hand-offs
      // (two 5 s bodies, 50 ms of real time each, need not overlap on a loaded machine).
      expect(work.maxInside).toBeLessThanOrEqual(2);
      expect(monitor.maxPermits).toBe(2);
      expect(monitor.violations).toEqual([]);
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    });
  });

  test('a fencing token drawn between a peek and its hand-off: the hand-off draws the head\'s own, greater one', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 1, waitStrategy: WaitStrategy.QUEUE, permitPath: '$.permit' });
    const tokens = new Map<string, number>();
    // Long enough that the holder is still inside once the test sees it there (it looks every 50 ms, 5 s here).
    const work = new WorkTracker(() => 30);
    const tracked = async (input: any, context: TaskContext) => {
      tokens.set(context.execution.name, input.permit.fencingToken);
      return work.handler(input, context);
    };
    let drawn: number | undefined;
    // Just before the first hand-off writes, another acquisition of the lock draws a fencing token (a
    // waiter that finds a handed-off permit, a CLI acquire once a permit is free...).
    const handOff = async (input: any, context: TaskContext) => {
      if (drawn === undefined) {
        const out = await localDynamoDb(context.simulator).send(
          new UpdateItemCommand({
            TableName: context.simulator.tableName('WorkflowLockTable'),
            Key: { lockName: { S: 'TestStack/Workflow' } },
            UpdateExpression: 'SET fencingToken = fencingToken + :one',
            ExpressionAttributeValues: { ':one': { N: '1' } },
            ReturnValues: 'UPDATED_NEW',
          }),
        );
        drawn = Number(out.Attributes!.fencingToken.N);
      }
      return updateItem(input, context);
    };
    await simulate(stack, { taskHandlers: { 'Hand Off Permit': handOff }, lambdaHandlers: { [workFunctionId]: tracked } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const holder = sim.startExecution(sm, {}, { name: 'holder' });
      await waitUntil(() => tokens.has('holder'), 'the holder in its body');
      const waiter = sim.startExecution(sm, {}, { name: 'waiter' });
      await Promise.all([holder.done, waiter.done]);

      expect([holder.status, waiter.status]).toEqual(['SUCCEEDED', 'SUCCEEDED']);
      expect(drawn).toBeGreaterThan(tokens.get('holder')!);
      // The waiter, admitted after that draw, holds a greater token.
      expect(tokens.get('waiter')).toBeGreaterThan(drawn!);
      // The hand-off draws the token in the write that grants the permit: nothing to do again.
      expect(holder.stateTransitions.get('Peek At Next Waiter')).toBe(1);
      expect(holder.stateTransitions.get('Hand Off Permit')).toBe(1);
      expect(tokens.get('waiter')).toBe(drawn! + 1);
      expect(waiter.stateTransitions.has('Wait In Queue Again')).toBe(false);
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    });
  });

  test('a release racing a served waiter and a new one: the newcomer is handed the permit, never left asleep beside it', async () => {
    // A and B hold both permits, C waits. A's release finds C queued and goes to peek; meanwhile B's
    // release serves C, so A's peek finds nobody; then D queues (the lock is still full) before A gives
    // its permit back. Giving it back then would leave D asleep beside a free permit.
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 2, waitStrategy: WaitStrategy.QUEUE });
    const { finish, body } = heldBodies(['A', 'B', 'C']);
    let sim!: Simulator;
    const { holds, queued, until } = lockProbes(() => sim);
    let d: Execution | undefined;
    const taskHandlers = {
      'Peek At Next Waiter': async (input: any, context: TaskContext) => {
        if (context.execution.name === 'A' && finish.has('B')) {
          finish.get('B')!();
          finish.delete('B');
          await until(() => holds('C'));
        }
        return updateItem(input, context);
      },
      'Release Permit Without Hand-Off': async (input: any, context: TaskContext) => {
        if (context.execution.name === 'A' && d === undefined) {
          d = sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflow.stateMachine)), {}, { name: 'D' });
          await until(() => queued('D'));
        }
        return updateItem(input, context);
      },
    };
    sim = await Simulator.start(stack, { taskHandlers, lambdaHandlers: { [workFunctionId]: body } });
    try {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const a = sim.startExecution(sm, {}, { name: 'A' });
      const b = sim.startExecution(sm, {}, { name: 'B' });
      await until(async () => finish.has('A') && finish.has('B'));
      const c = sim.startExecution(sm, {}, { name: 'C' });
      await until(() => queued('C'));
      finish.get('A')!();
      await Promise.all([a.done, b.done]);
      await d!.done;
      // C, served by B, holds its permit until now.
      finish.get('C')!();
      await c.done;

      expect([a, b, c, d!].map((e) => e.status)).toEqual(['SUCCEEDED', 'SUCCEEDED', 'SUCCEEDED', 'SUCCEEDED']);
      expect(a.stateTransitions.get('Release Permit Without Hand-Off')).toBe(1);
      // Refused (D waits), A checked that it still held the permit, looked again, and handed it to D.
      expect(a.stateTransitions.get('Is Permit Still Held')).toBe(1);
      expect(a.stateTransitions.get('Wake Next Waiter')).toBe(1);
      // D was woken, not left to find a free permit when its wait timed out.
      expect(d!.stateTransitions.has('Wait In Queue Again')).toBe(false);
      expect(d!.stateTransitions.get('Wait In Queue')).toBe(1);
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    } finally {
      await sim.stop();
    }
  });

  test('a ticket whose waiter is still on its way is marked and skipped: the releaser gives the permit back, the waiter finds it', async () => {
    // Limit 1: A holds, B takes ticket 1 and is slow to write its ticket item. A's serve is refused
    // (no waiter yet): it marks the ticket, finds no waiter, looks for the next ticket (none) and gives
    // the permit back. B's first wait is then refused (its ticket was skipped), and B takes the free permit.
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 1, waitStrategy: WaitStrategy.QUEUE });
    const { finish, body } = heldBodies(['A']);
    let sim!: Simulator;
    const { until } = lockProbes(() => sim);
    let ticketTaken = false;
    let aDone = false;
    const taskHandlers = {
      'Take Ticket': async (input: any, context: TaskContext) => {
        const out = await updateItem(input, context);
        ticketTaken = true;
        return out;
      },
      'Wait In Queue': async (input: any, context: TaskContext) => {
        await until(async () => aDone);
        return context.simulator.dynamo.run('arn:aws:states:::aws-sdk:dynamodb:updateItem', input);
      },
    };
    sim = await Simulator.start(stack, { taskHandlers, lambdaHandlers: { [workFunctionId]: body } });
    try {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const a = sim.startExecution(sm, {}, { name: 'A' });
      void a.done.then(() => (aDone = true));
      await until(async () => finish.has('A'));
      const b = sim.startExecution(sm, {}, { name: 'B' });
      await until(async () => ticketTaken);
      finish.get('A')!();
      await Promise.all([a.done, b.done]);

      expect([a.status, b.status]).toEqual(['SUCCEEDED', 'SUCCEEDED']);
      const path = ['Peek At Next Waiter', 'Serve Ticket', 'Mark Ticket Served', 'Check Ticket', 'Release Permit Without Hand-Off'];
      expect(path.map((s) => a.stateTransitions.get(s))).toEqual([2, 1, 1, 1, 1]);
      expect(a.stateTransitions.has('Hand Off Permit')).toBe(false);
      // B's wait was refused on the marked ticket; it found the permit free.
      expect(['Wait In Queue', 'Check Handed-Off Permit', 'Poll For Permit'].map((s) => b.stateTransitions.get(s))).toEqual([1, 1, 1]);
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    } finally {
      await sim.stop();
    }
  });

  test('two releases at once claim different tickets: each hands its permit to its own waiter, neither retries', async () => {
    // A and B hold both permits, C and D wait. Both releases claim a ticket before either hands off:
    // each claim moves the head, so they serve different waiters instead of racing for C.
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 2, waitStrategy: WaitStrategy.QUEUE });
    const { finish, body } = heldBodies(['A', 'B', 'C']);
    let sim!: Simulator;
    const { queued, until } = lockProbes(() => sim);
    const claimed: string[] = [];
    const taskHandlers = {
      'Peek At Next Waiter': async (input: any, context: TaskContext) => {
        const out: any = await updateItem(input, context);
        claimed.push(`${context.execution.name}:${out.Attributes.queueHead.N}`);
        return out;
      },
      'Serve Ticket': async (input: any, context: TaskContext) => {
        await until(async () => claimed.length === 2);
        return context.simulator.dynamo.run('arn:aws:states:::dynamodb:deleteItem', input);
      },
    };
    sim = await Simulator.start(stack, { taskHandlers, lambdaHandlers: { [workFunctionId]: body } });
    try {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const a = sim.startExecution(sm, {}, { name: 'A' });
      const b = sim.startExecution(sm, {}, { name: 'B' });
      await until(async () => finish.has('A') && finish.has('B'));
      const c = sim.startExecution(sm, {}, { name: 'C' });
      await until(() => queued('C'));
      const d = sim.startExecution(sm, {}, { name: 'D' });
      await until(() => queued('D'));
      finish.get('A')!();
      finish.get('B')!();
      await Promise.all([a.done, b.done, d.done]);
      finish.get('C')!();
      await c.done;
      await sim.idle();

      expect([a, b, c, d].map((e) => e.status)).toEqual(['SUCCEEDED', 'SUCCEEDED', 'SUCCEEDED', 'SUCCEEDED']);
      // Tickets 1 (C) and 2 (D), one to each releaser.
      expect(claimed.map((x) => x.split(':')[1]).sort()).toEqual(['1', '2']);
      expect(new Set(claimed.map((x) => x.split(':')[0]))).toEqual(new Set(['A', 'B']));
      for (const releaser of [a, b]) {
        // One give-back refused (tickets wait), one claim, one serve (the ticket's delete), one hand-off, one wake-up.
        for (const state of ['Release Permit', 'Peek At Next Waiter', 'Serve Ticket', 'Hand Off Permit', 'Wake Next Waiter']) {
          expect([releaser.name, state, releaser.stateTransitions.get(state)]).toEqual([releaser.name, state, 1]);
        }
      }
      // Both waiters were woken, not left to find their permit when their wait timed out.
      expect([c, d].every((e) => e.stateTransitions.get('Wait In Queue') === 1 && !e.stateTransitions.has('Wait In Queue Again'))).toBe(true);
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
      // Served tickets leave nothing behind: the lock item is all the table holds.
      expect((await sim.scan('WorkflowLockTable')).map((i) => i.lockName.S)).toEqual(['TestStack/Workflow']);
    } finally {
      await sim.stop();
    }
  });

  // A rate alone gives the permit back beside the body, once its interval (here 10 minutes) has passed.
  // The last case throttles "Leave Queue" past its retries: the ticket stays, and the release skips it
  // as before, its hand-off refused while the waiter holds its permit.
  test.each([
    ['a concurrency limit', { concurrencyLimit: 1 }, false],
    ['a rate alone', { rateLimit: RateLimit.of(1, Duration.minutes(10)) }, false],
    ['a concurrency limit, the leave throttled', { concurrencyLimit: 1 }, true],
  ])('a waiter that gets in by polling leaves the queue: no release hands it a second permit (%s)', async (_, limits, throttled) => {
    const props = { ...limits, waitStrategy: WaitStrategy.QUEUE, queueCheckInterval: Duration.seconds(30), permitPath: '$.permit' };
    const { stack, workflow, workFunctionId } = workflowStack(props);
    let itemsInBody: Array<Record<string, any>> | undefined;
    let permitInBody: unknown;
    const body = async (input: any, context: TaskContext) => {
      if (context.execution.name === 'waiter') {
        itemsInBody = await context.simulator.scan('WorkflowLockTable');
        permitInBody = input.permit;
      }
      await context.simulator.sleep(input.seconds, context.signal);
      return {};
    };
    let leaveCalls = 0;
    const taskHandlers = {
      'Leave Queue': async () => {
        leaveCalls++;
        throw new TaskError('DynamoDB.ProvisionedThroughputExceededException', 'The level of configured provisioned throughput for the table was exceeded');
      },
    };
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: body }, ...(throttled ? { taskHandlers } : {}) }, async (sim) => {
      const { holder, waiter } = await queueBesideFreedPermit(sim, workflow);
      await waiter.done;

      expect([waiter.status, waiter.error, waiter.cause]).toEqual(['SUCCEEDED', undefined, undefined]);
      expect(waiter.stateTransitions.get('Poll For Permit Again')).toBe(1);
      // Throttled: the first try and 2 retries (each a transition), then in with the ticket left.
      expect([waiter.stateTransitions.get('Leave Queue'), leaveCalls, waiter.stateTransitions.has('Ticket Left In Queue')]).toEqual(
        throttled ? [3, 3, true] : [1, 0, false],
      );
      expect(waiter.stateTransitions.has('Check Handed-Off Permit Again')).toBe(false);
      // Inside, it held the permit, and had the fencing token the poll drew; its ticket still waited,
      // without an item (or with the waiter's, when it could not leave).
      const lockInBody = itemsInBody!.find((i) => i.lockName.S === 'TestStack/Workflow')!;
      expect(lockInBody[waiter.holderId]).toBeDefined();
      expect(permitInBody).toEqual({ fencingToken: Number(lockInBody.fencingToken.N) });
      expect([lockInBody.queueHead.N, lockInBody.queueTail.N]).toEqual(['0', '1']);
      const ticketsInBody = itemsInBody!.filter((i) => isTicketKey(i.lockName.S));
      expect(ticketsInBody.map((i) => [i.lockName.S, i[TICKET_WAITER]?.S])).toEqual(throttled ? [[ticketKey('TestStack/Workflow', 1), waiter.holderId]] : []);
      // Its own release claimed that ticket and skipped it, as one whose waiter never wrote its item
      // (or, when it could not leave, as one whose waiter holds a permit: a refused hand-off): no
      // wake-up, and the permit was given back.
      const times = (prefix: string) =>
        [...waiter.stateTransitions].filter(([state]) => state.startsWith(prefix)).reduce((n, [, count]) => n + count, 0);
      expect([times('Mark Ticket Served'), times('Hand Off Permit'), times('Wake Next Waiter'), times('Release Permit Without Hand-Off')]).toEqual(
        throttled ? [0, 1, 0, 1] : [1, 0, 0, 1],
      );
      holder.abort('Test.Stop', 'done with it');
      await holder.done;
      await sim.idle();
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    });
  });

  test('a run stopped in Leave Queue and redriven claims its entry before the body: freed by the cleanup meanwhile, it queues again', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({
      concurrencyLimit: 1,
      waitStrategy: WaitStrategy.QUEUE,
      queueCheckInterval: Duration.seconds(30),
      reconcilerScheduleEnabled: false,
    });
    let entryInBody: Record<string, any> | undefined | null = null;
    const body = async (input: any, context: TaskContext) => {
      if (context.execution.name === 'waiter') {
        const items = await context.simulator.scan('WorkflowLockTable');
        entryInBody = items.find((i) => i.lockName.S === 'TestStack/Workflow')?.[context.execution.holderId];
      }
      await context.simulator.sleep(input.seconds, context.signal);
      return {};
    };
    let leaveCalls = 0;
    const taskHandlers = {
      // The first run is stopped in Leave Queue (as while its retries wait); the redriven run's call is real.
      'Leave Queue': async (input: any, context: TaskContext) => {
        if (++leaveCalls === 1) await context.simulator.sleep(3600, context.signal);
        return context.simulator.dynamo.run('arn:aws:states:::dynamodb:deleteItem', input);
      },
    };
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: body }, taskHandlers }, async (sim) => {
      const { holder, waiter } = await queueBesideFreedPermit(sim, workflow);
      await waitUntil(() => waiter.stateTransitions.has('Leave Queue'), 'the waiter in Leave Queue, holding the permit it polled');
      waiter.abort('Test.Stop', 'stopped in Leave Queue');
      await waiter.done;
      await sim.idle();
      // Its cleanup freed the entry of the stopped run.
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);

      const again = await sim.redriveExecution(waiter.arn);
      expect(again.status).toBe('SUCCEEDED');
      // Its body ran holding an entry of its own run (not on the freed entry of the stopped run).
      expect(entryInBody).toMatchObject({ M: { [HOLDER_REDRIVE_COUNT]: { N: '1' } } });
      // Refused (the ticket is the run before's), it claimed: the entry was gone, so it queued again
      // and took the free permit.
      for (const state of ['Redriven At Leave Queue?', 'Check Handed-Off Permit Again', 'Take New Ticket']) {
        expect([state, again.stateTransitions.has(state)]).toEqual([state, true]);
      }
      expect(again.stateTransitions.has('Ticket Left In Queue')).toBe(false);
      holder.abort('Test.Stop', 'done with it');
      await holder.done;
      await sim.idle();
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    });
  });

  test('a waiter stopped while queued: its permit is taken back and handed to the next', async () => {
    // No sweep, and the stopped waiter's status event is lost, so that its cleanup cannot drop its
    // ticket first: the release finds the ticket and hands the permit to a closed task. The first
    // holds for 300 s (3 s here), so that the stop always comes before its release; the waits are
    // checked hourly, so that no wait times out meanwhile (at the default 5 minutes, the next
    // waiter's first wait timed out just as the release woke it, and a second take-back followed).
    const { stack, workflow, workFunctionId } = workflowStack({
      concurrencyLimit: 1,
      waitStrategy: WaitStrategy.QUEUE,
      queueCheckInterval: Duration.hours(1),
      reconcilerScheduleEnabled: false,
    });
    const work = new WorkTracker((input) => input.seconds ?? 10);
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler }, eventFaults: { lossRate: 1 } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const first = sim.startExecution(sm, { seconds: 300 }, { name: 'first' });
      await waitUntil(() => work.byExecution.has(first.arn), 'the first in its body');
      const gone = sim.startExecution(sm, {}, { name: 'gone' });
      // Queued in this order (a second of the simulation is 10 ms here: CPU time alone can reorder them).
      await waitUntil(() => gone.stateTransitions.has('Wait In Queue'), 'the first waiter queued');
      const next = sim.startExecution(sm, {}, { name: 'next' });
      await waitUntil(() => next.stateTransitions.has('Wait In Queue'), 'the second waiter queued');
      gone.abort('Test.Stop', 'stopped while queued');
      await Promise.all([first.done, gone.done, next.done]);
      await sim.idle();

      expect([first.status, gone.status, next.status]).toEqual(['SUCCEEDED', 'ABORTED', 'SUCCEEDED']);
      expect(first.stateTransitions.get('Take Back Permit')).toBe(1);
      // Woken once, in its first wait.
      expect(next.stateTransitions.get('Wait In Queue Again')).toBeUndefined();
      expect(work.byExecution.has(gone.arn)).toBe(false);
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    });
  });
});
