import { App, Duration, Stack } from 'aws-cdk-lib';
import { Annotations, Match, Template } from 'aws-cdk-lib/assertions';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { main } from '../client/cli';
import { SemaphoreClient } from '../client/semaphore-client';
import { demoSubject } from '../demo/run';
import { brokenInvariants, metricFilterSums, mostInAnyWindow, runScenario, Simulator } from '../simulator';
import { CleanFromIncomplete, IdempotencyKey, RateLimit, SemaphoreReconciler, SemaphoreTable, WaitStrategy } from '../src';
import { lockItem, lockState, simulate, stateMachineLogicalId, until, WorkTracker, workflowStack } from './helpers';
import {
  BODIES_RUNNING,
  BODY_LIMIT,
  RATE_INTERVAL,
  FENCING_TOKEN,
  HOLDER_ACQUIRED_AT,
  HOLDER_CLAIMED,
  HOLDER_IN_BODY,
  HOLDER_PERMITS,
  HOLDER_REDRIVE_COUNT,
  PERMITS_IN_USE,
} from '../src/private/lock-schema';
import { RELEASE_AT_INTERVAL_SUFFIX, STATE } from '../src/private/state-names';

/*
 * The rate limit: at most `count` bodies start in any `interval`, wherever the window begins, because
 * every start of a body holds its permit for at least the interval, on every path that frees it.
 */

const LOCK = 'TestStack/Workflow';

test('mostInAnyWindow counts a sliding window: half-open, wherever it starts', () => {
  expect(mostInAnyWindow([], 1000)).toBe(0);
  expect(mostInAnyWindow([0, 999, 1000, 1999], 1000)).toBe(2);
  expect(mostInAnyWindow([0, 500, 999, 1000], 1000)).toBe(3);
  expect(mostInAnyWindow([5000, 0, 400, 4800, 4900], 1000)).toBe(3);
});

describe('validation at synth', () => {
  test.each([
    [() => RateLimit.perSecond(0), /`rateLimit` count must be an integer from 1 to 1000 .*got: 0/],
    [() => RateLimit.perMinute(2.5), /`rateLimit` count must be an integer from 1 to 1000 .*got: 2.5/],
    [() => RateLimit.of(5, Duration.millis(500)), /`rateLimit` interval must be a whole number of seconds from 1 to 86400 .*got: 500 millis/],
    [() => RateLimit.of(5, Duration.days(2)), /`rateLimit` interval must be a whole number of seconds from 1 to 86400 .*got: 2 days/],
  ])('a bad rate is refused, naming the value: %#', (make, message) => {
    expect(make).toThrow(message);
  });

  test('a lease shorter than the interval, or a limit read at run time beside a rate, is refused', () => {
    expect(() => workflowStack({ rateLimit: RateLimit.perMinute(10), leaseDuration: Duration.seconds(30) })).toThrow(
      /`leaseDuration` \(30 seconds\) must be at least the `rateLimit` interval \(1 minute\)/,
    );
    expect(() => workflowStack({ rateLimit: RateLimit.perSecond(10), concurrencyLimit: sfn.JsonPath.numberAt('$.limit') })).toThrow(
      /`concurrencyLimit` and `rateLimit` must both be known at synth .*got: a concurrencyLimit read at run time/,
    );
    // Above the count, the lock item keeps an entry per slot and per permit: both must fit.
    expect(() => workflowStack({ rateLimit: RateLimit.perSecond(200), concurrencyLimit: 900 })).toThrow(
      /`concurrencyLimit` \(900\) plus the `rateLimit` count \(200\) must be at most 1000 when the limit is above the count/,
    );
    expect(() => workflowStack({ rateLimit: RateLimit.perSecond(200), concurrencyLimit: 800 })).not.toThrow();
    expect(() => workflowStack({ rateLimit: RateLimit.perSecond(1000), concurrencyLimit: 900 })).not.toThrow();
  });

  test('the lock\'s permits are the smaller of the limit and the count, or with a lower limit the count and a body slot each; the cleanup and the reconciler hold for the interval', () => {
    const limitOf = (props: Parameters<typeof workflowStack>[0]) => {
      const { workflow } = workflowStack(props);
      const cfn = workflow.stateMachine.node.defaultChild as sfn.CfnStateMachine;
      const definition = JSON.stringify(Stack.of(workflow).resolve(cfn.definitionString));
      return Number(/\\":limit\\":\{\\"N\\":\\"(\d+)\\"/.exec(definition)![1]);
    };
    expect(limitOf({ rateLimit: RateLimit.perSecond(7) })).toBe(7);
    expect(limitOf({ rateLimit: RateLimit.perSecond(7), concurrencyLimit: 3 })).toBe(7);
    expect(limitOf({ rateLimit: RateLimit.perSecond(2), concurrencyLimit: 3 })).toBe(2);
    expect(limitOf({})).toBe(1);
    const bodyLimitOf = (props: Parameters<typeof workflowStack>[0]) => {
      const { workflow } = workflowStack(props);
      const cfn = workflow.stateMachine.node.defaultChild as sfn.CfnStateMachine;
      const definition = JSON.stringify(Stack.of(workflow).resolve(cfn.definitionString));
      return /\\":bodyLimit\\":\{\\"N\\":\\"(\d+)\\"/.exec(definition)?.[1];
    };
    expect(bodyLimitOf({ rateLimit: RateLimit.perSecond(7), concurrencyLimit: 3 })).toBe('3');
    expect(bodyLimitOf({ rateLimit: RateLimit.perSecond(7), concurrencyLimit: 7 })).toBeUndefined();
    expect(bodyLimitOf({ rateLimit: RateLimit.perSecond(7), concurrencyLimit: 12 })).toBe('12');
    expect(bodyLimitOf({ rateLimit: RateLimit.perSecond(7) })).toBeUndefined();

    const { stack } = workflowStack({ rateLimit: RateLimit.of(4, Duration.seconds(30)) });
    const template = Template.fromStack(stack);
    template.hasResourceProperties('AWS::Lambda::Function', { Environment: { Variables: { HOLD_AFTER_STOP_SECONDS: '30' } } });
    const cleanup = Object.values(template.findResources('AWS::StepFunctions::StateMachine')).find((r) =>
      JSON.stringify(r).includes('Release Permit Of Stopped Execution'),
    );
    expect(JSON.stringify(cleanup)).toContain('\\"Hold Permit For Rate Interval\\":{\\"Type\\":\\"Wait\\",\\"Seconds\\":30');
  });

  test('a wait for a body slot backs off from pollInterval to a minute apart; a pollInterval of a minute or more stays fixed', () => {
    const slotWait = (pollInterval: Duration) => {
      const { workflow } = workflowStack({ rateLimit: RateLimit.perSecond(7), concurrencyLimit: 3, pollInterval });
      const cfn = workflow.stateMachine.node.defaultChild as sfn.CfnStateMachine;
      const parts: unknown[] = Stack.of(workflow).resolve(cfn.definitionString)['Fn::Join'][1];
      const states = JSON.parse(parts.map((p) => (typeof p === 'string' ? p : 'token')).join('')).States;
      const wait = states[STATE.waitForBodySlot];
      return { retry: wait.Retry, cause: wait.Branches[0].States[STATE.bodySlotsTaken].Cause };
    };
    const backingOff = slotWait(Duration.seconds(3));
    expect(backingOff.retry).toEqual([
      { ErrorEquals: ['SemaphoreAcquireTimeout'], IntervalSeconds: 3, MaxAttempts: 222, BackoffRate: 1.2, MaxDelaySeconds: 60 },
    ]);
    expect(backingOff.cause).toMatch(/ 222 tries over 3 hours 30 minutes, the first after 3 seconds, then 1\.2 times longer each, up to 1 minute$/);
    const fixed = slotWait(Duration.seconds(90));
    expect(fixed.retry).toEqual([{ ErrorEquals: ['SemaphoreAcquireTimeout'], IntervalSeconds: 90, MaxAttempts: 222, BackoffRate: 1 }]);
    expect(fixed.cause).toMatch(/ 222 tries, one every 1 minute 30 seconds$/);
  });

  test('a rate alone, or a concurrencyLimit above its count, releases beside the body; above the count the body keeps a slot; no warning', () => {
    for (const concurrencyLimit of [20, 10, 5, undefined]) {
      const annotations = Annotations.fromStack(workflowStack({ rateLimit: RateLimit.perSecond(10), concurrencyLimit }).stack);
      annotations.hasNoWarning('/TestStack/Workflow', Match.stringLikeRegexp('rateLimit'));
    }
    const states = (props: Parameters<typeof workflowStack>[0]) => {
      const { workflow } = workflowStack(props);
      return JSON.stringify(Stack.of(workflow).resolve((workflow.stateMachine.node.defaultChild as sfn.CfnStateMachine).definitionString));
    };
    expect(states({ rateLimit: RateLimit.perSecond(10) })).toContain(`${STATE.release}${RELEASE_AT_INTERVAL_SUFFIX}`);
    expect(states({ rateLimit: RateLimit.perSecond(10) })).not.toContain(STATE.keepBodySlot);
    expect(states({ rateLimit: RateLimit.perSecond(10), concurrencyLimit: 10 })).not.toContain(RELEASE_AT_INTERVAL_SUFFIX);
    expect(states({ rateLimit: RateLimit.perSecond(10), concurrencyLimit: 5 })).not.toContain(RELEASE_AT_INTERVAL_SUFFIX);
    const above = states({ rateLimit: RateLimit.perSecond(10), concurrencyLimit: 20 });
    for (const state of [STATE.keepBodySlot, STATE.handOffKeepingSlot, STATE.takeBackIntoSlot]) expect(above).toContain(`${state}${RELEASE_AT_INTERVAL_SUFFIX}`);
    expect(above).toContain(STATE.releaseBodySlotAndEntry);
    expect(above).toContain(STATE.takeBodySlot);
  });

  test('holdAfterStop of the cleanup and the reconciler must be whole seconds', () => {
    const stack = new Stack(new App(), 'S');
    const table = new SemaphoreTable(stack, 'T');
    const sm = new sfn.StateMachine(stack, 'M', { definitionBody: sfn.DefinitionBody.fromChainable(new sfn.Pass(stack, 'P')) });
    expect(
      () => new CleanFromIncomplete(stack, 'C', { table, lockName: 'l', protectedStateMachines: [sm], holdAfterStop: Duration.millis(1500) }),
    ).toThrow(/`holdAfterStop` must be a whole number of seconds, at least 1 second, got: 1 second 500 millis/);
    expect(() => new SemaphoreReconciler(stack, 'R', { table, holdAfterStop: Duration.millis(200) })).toThrow(
      /`holdAfterStop` must be a whole number of seconds, at least 1 second, got: 200 millis/,
    );
  });
});

describe.each([WaitStrategy.QUEUE, WaitStrategy.POLLING])('%s', (waitStrategy) => {
  test('a burst of 15 at 3 per 10 s with 1 s bodies: never more than 3 starts in any 10 s, drained in 5 windows, nothing left held', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({
      rateLimit: RateLimit.of(3, Duration.seconds(10)),
      waitStrategy,
      ...(waitStrategy === WaitStrategy.QUEUE ? {} : { pollInterval: Duration.seconds(1) }),
      reconcilerScheduleEnabled: false,
    });
    const work = new WorkTracker(() => 1);
    // At a time scale of 0.1 a millisecond of CPU is 10 ms of simulated time (at the usual 0.01, 100 ms).
    await simulate(stack, { timeScale: 0.1, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const executions = Array.from({ length: 15 }, (_, i) => sim.startExecution(sm, { i }));
      await Promise.all(executions.map((e) => e.done));

      expect(executions.map((e) => e.status)).toEqual(Array(15).fill('SUCCEEDED'));
      expect(work.starts).toHaveLength(15);
      expect(mostInAnyWindow(work.starts, 10_000)).toBe(3);
      // 15 at 3 per 10 s: five windows, the last starts at least 40 s after the first. Each permit
      // passes on one hand-off (or poll, at most 1 s) after its 10 s, so every window is used.
      const span = (Math.max(...work.starts) - Math.min(...work.starts)) / 1000;
      expect(span).toBeGreaterThanOrEqual(40);
      expect(span).toBeLessThan(4 * 10 * 1.25);
      // The output is the body's, not the Wait branch's.
      expect(executions[0].output).toEqual({ worked: true, echo: { i: 0 } });
      await sim.idle();
      expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
    });
  });
});

/** The CLI's environment for the simulator's lock table. */
function cliEnv(sim: Simulator): Record<string, string> {
  const aws = { AWS_ENDPOINT_URL_DYNAMODB: sim.db.endpoint, AWS_REGION: 'us-east-1', AWS_ACCESS_KEY_ID: 'local', AWS_SECRET_ACCESS_KEY: 'local' };
  return { ...aws, CDK_SFN_SEMAPHORE_TABLE: sim.tableName('WorkflowLockTable') };
}

/** The lock item's count of bodies holding a slot (BODIES_RUNNING), and how many entries carry the mark. */
async function bodySlots(sim: Simulator): Promise<{ bodiesRunning: number; marked: number; bodyLimit?: number }> {
  const item = (await lockItem(sim))!;
  const marked = Object.values(item).filter((v) => v.M?.[HOLDER_IN_BODY] !== undefined).length;
  return { bodiesRunning: Number(item[BODIES_RUNNING]?.N ?? 0), marked, bodyLimit: item[BODY_LIMIT] ? Number(item[BODY_LIMIT].N) : undefined };
}

describe('beside a lower concurrency limit: the rate\'s permits, and a body slot each', () => {
  test('at most 10 per interval, never more than 5 at once, bodies shorter than the interval: the rate is reached', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({
      rateLimit: RateLimit.of(10, Duration.seconds(10)),
      concurrencyLimit: 5,
      pollInterval: Duration.seconds(1),
      reconcilerScheduleEnabled: false,
    });
    const work = new WorkTracker(() => 2);
    // At a time scale of 0.1 a millisecond of CPU is 10 ms of simulated time: hand-offs stay well under
    // the 10 s interval even on a busy machine.
    await simulate(stack, { timeScale: 0.1, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const executions = Array.from({ length: 60 }, (_, i) => sim.startExecution(sm, { i }));
      await Promise.all(executions.map((e) => e.done));

      expect(executions.map((e) => e.status)).toEqual(Array(60).fill('SUCCEEDED'));
      expect(work.maxInside).toBe(5);
      expect(mostInAnyWindow(work.starts, 10_000)).toBe(10);
      // 60 at 10 per 10 s start over at least 50 s. Sharing one counter (5 permits, each held 10 s) they
      // would start 5 per 10 s, over at least 110 s.
      const span = (Math.max(...work.starts) - Math.min(...work.starts)) / 1000;
      expect(span).toBeGreaterThanOrEqual(50);
      expect(span).toBeLessThan(80);
      expect(executions[0].output).toEqual({ worked: true, echo: { i: 0 } });
      await sim.idle();
      expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
      expect(await bodySlots(sim)).toEqual({ bodiesRunning: 0, marked: 0, bodyLimit: 5 });
    });
  });

  test('long bodies: the concurrency limit binds, waiters for a slot get one as bodies end, and the rate still holds', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({
      rateLimit: RateLimit.of(4, Duration.seconds(5)),
      concurrencyLimit: 2,
      pollInterval: Duration.seconds(1),
      reconcilerScheduleEnabled: false,
    });
    const work = new WorkTracker((input) => input.seconds);
    // A tenth of real time: at the default hundredth, a round of the slot's poll on a busy machine took
    // longer in simulated time than a long body, and no waiter polled twice (a CI run of 2026-11-28).
    await simulate(stack, { timeScale: 0.1, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      // Long bodies: the concurrency limit binds; short ones: the interval does.
      const executions = Array.from({ length: 12 }, (_, i) => sim.startExecution(sm, { seconds: i < 6 ? 8 : 1 }));
      await Promise.all(executions.map((e) => e.done));

      expect(executions.every((e) => e.status === 'SUCCEEDED')).toBe(true);
      expect(work.maxInside).toBe(2);
      expect(mostInAnyWindow(work.starts, 5_000)).toBeLessThanOrEqual(4);
      // Holders of a permit waited for a slot while two long bodies ran.
      expect(executions.some((e) => (e.stateTransitions.get(STATE.waitForBodySlot) ?? 0) > 0)).toBe(true);
      // The log's metrics tell the two waits apart: Waits (for a permit: the rate) and BodySlotWaits
      // (for a slot: the concurrency limit), once per execution that waited, however many rounds.
      const entered = (state: string) =>
        executions.filter((e) => e.history.some((h) => h.type === 'ParallelStateEntered' && h.name === state)).length;
      const sums = metricFilterSums(Template.fromStack(stack).toJSON(), executions);
      expect(sums).toEqual({
        Acquisitions: 12,
        Waits: entered(STATE.waitForPermit),
        BodySlotWaits: entered(STATE.waitForBodySlot),
        AcquireTimeouts: 0,
      });
      expect([sums.Waits > 0, sums.BodySlotWaits > 0]).toEqual([true, true]);
      expect(executions.some((e) => e.stateTransitions.get(STATE.waitForBodySlot)! > 1)).toBe(true); // rounds, counted once
      await sim.idle();
      expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
      expect(await bodySlots(sim)).toEqual({ bodiesRunning: 0, marked: 0, bodyLimit: 2 });
    });
  });

  test('a wait for a body slot has a budget: past it, the execution gives back its permit and fails with SemaphoreAcquireTimeout', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({
      rateLimit: RateLimit.of(2, Duration.seconds(10)),
      concurrencyLimit: 1,
      pollInterval: Duration.seconds(1),
      reconcilerScheduleEnabled: false,
    });
    const work = new WorkTracker(() => 1);
    // The tries back off to a minute apart: 3.4 hours of simulated time, 6 s of real time.
    await simulate(stack, { timeScale: 0.0005, schedules: false, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      // A client lease holds the one slot (and one of the two permits) for as long as the test runs.
      const client = new SemaphoreClient({ tableName: sim.tableName('WorkflowLockTable'), dynamodb: sim.db.client });
      const lease = await client.acquire(LOCK, { leaseSeconds: 6 * 3600 });
      expect(lease).toBeDefined();
      const waiter = await sim.startExecution(sm, {}).done;

      expect(waiter.status).toBe('FAILED');
      expect(waiter.error).toBe('SemaphoreAcquireTimeout');
      expect(waiter.cause).toBe(
        'Every body slot of the lock (concurrencyLimit 1) stayed taken for 222 tries over 3 hours 24 minutes, ' +
          'the first after 1 second, then 1.2 times longer each, up to 1 minute',
      );
      // It waited that long (the last try's own time aside).
      expect(waiter.stopDate! - waiter.startDate).toBeGreaterThanOrEqual(3.4 * 3600_000);
      expect(waiter.stateTransitions.get(STATE.waitForBodySlot)).toBe(223);
      expect(work.starts).toHaveLength(0);
      // It gave its permit back (after the rate's hold), within its history budget.
      expect(waiter.historyEvents).toBeLessThan(25_000);
      expect(waiter.stateTransitions.get(STATE.holdAfterFailure)).toBe(1);
      expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 1, holders: [lease!.leaseId] }]);
      expect(await client.forceRelease(LOCK, lease!.leaseId)).toBe(true);
      expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
      expect(await bodySlots(sim)).toEqual({ bodiesRunning: 0, marked: 0, bodyLimit: 1 });
    });
  });

  test('a failed body gives its slot back at once, and its permit after the interval', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({
      rateLimit: RateLimit.of(2, Duration.seconds(60)),
      concurrencyLimit: 1,
      pollInterval: Duration.seconds(1),
      reconcilerScheduleEnabled: false,
    });
    const work = new WorkTracker(() => 1);
    await simulate(stack, { timeScale: 0.1, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const failing = sim.startExecution(sm, { fail: true });
      await until(() => work.inside === 1, 'the failing body to run');
      const next = sim.startExecution(sm, {});
      const [failed, succeeded] = await Promise.all([failing.done, next.done]);

      expect([failed.status, succeeded.status]).toEqual(['FAILED', 'SUCCEEDED']);
      expect(failed.stateTransitions.get(STATE.releaseBodySlotAfterFailure)).toBe(1);
      // The second body starts about a poll after the first failed, not after its 60 s hold.
      expect(work.startedAt.get(succeeded.arn)! - work.startedAt.get(failed.arn)!).toBeLessThan(20_000);
      // The failed execution held its permit for the interval.
      expect(failed.stopDate! - work.startedAt.get(failed.arn)!).toBeGreaterThanOrEqual(60_000);
      await sim.idle();
      expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
      expect(await bodySlots(sim)).toEqual({ bodiesRunning: 0, marked: 0, bodyLimit: 1 });
    });
  });

  test.each([WaitStrategy.QUEUE, WaitStrategy.POLLING])(
    '%s: failing and stopped bodies free their slot and, after the interval, their permit; never more than the limit inside',
    async (waitStrategy) => {
      const { stack, workflow, workFunctionId } = workflowStack({
        rateLimit: RateLimit.of(4, Duration.seconds(10)),
        concurrencyLimit: 2,
        waitStrategy,
        pollInterval: Duration.seconds(1),
        reconcilerScheduleEnabled: false,
      });
      const work = new WorkTracker(() => 3);
      await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
        const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
        const inputs = Array.from({ length: 12 }, (_, i) => ({ i, fail: i % 4 === 0, abortInside: i % 4 === 1 }));
        const executions = inputs.map((input) => sim.startExecution(sm, input));
        await Promise.all(executions.map((e) => e.done));
        await sim.idle();

        expect(executions.map((e) => e.status)).toEqual(inputs.map((i) => (i.fail ? 'FAILED' : i.abortInside ? 'ABORTED' : 'SUCCEEDED')));
        expect(work.starts).toHaveLength(12);
        expect(work.maxInside).toBeLessThanOrEqual(2);
        expect(mostInAnyWindow(work.starts, 10_000)).toBeLessThanOrEqual(4);
        expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
        expect(await bodySlots(sim)).toEqual({ bodiesRunning: 0, marked: 0, bodyLimit: 2 });
      });
    },
  );
});

describe('beside a higher concurrency limit: the permit goes back at the interval, the body keeps a slot', () => {
  test.each([WaitStrategy.QUEUE, WaitStrategy.POLLING])(
    '%s: 3 per 10 s and 5 at once with 25 s bodies: both bounds reached, never passed; failing and stopped bodies free their slot',
    async (waitStrategy) => {
      const { stack, workflow, workFunctionId } = workflowStack({
        rateLimit: RateLimit.of(3, Duration.seconds(10)),
        concurrencyLimit: 5,
        waitStrategy,
        pollInterval: Duration.seconds(1),
        reconcilerScheduleEnabled: false,
      });
      const work = new WorkTracker(() => 25);
      // A tenth of real time: the 25 s bodies overlap, and the interval stays far above a hand-off.
      await simulate(stack, { timeScale: 0.1, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
        const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
        const inputs = Array.from({ length: 14 }, (_, i) => ({ i, fail: i === 4 || i === 9, abortInside: i === 6 || i === 11 }));
        const executions = inputs.map((input) => sim.startExecution(sm, input));
        await Promise.all(executions.map((e) => e.done));

        expect(executions.map((e) => e.status)).toEqual(inputs.map((i) => (i.fail ? 'FAILED' : i.abortInside ? 'ABORTED' : 'SUCCEEDED')));
        expect(work.starts).toHaveLength(14);
        // Never 4 starts in any 10 s, never 6 bodies at once; but more than the rate's 3 run at once:
        // each permit went back while its body ran on in its slot.
        expect(mostInAnyWindow(work.starts, 10_000)).toBeLessThanOrEqual(3);
        expect(work.maxInside).toBe(5);
        const kept = executions.filter((e) => e.stateTransitions.get(`${STATE.keepBodySlot}${RELEASE_AT_INTERVAL_SUFFIX}`) === 1);
        const handedKeeping = executions.filter((e) => e.stateTransitions.get(`${STATE.handOffKeepingSlot}${RELEASE_AT_INTERVAL_SUFFIX}`) === 1);
        expect(kept.length + handedKeeping.length).toBeGreaterThanOrEqual(10);
        // With the queue, a permit goes to the next waiter at the interval, the body keeping its slot.
        if (waitStrategy === WaitStrategy.QUEUE) expect(handedKeeping.length).toBeGreaterThan(0);
        // Five 25 s bodies at once: some held a permit and waited for a slot.
        expect(executions.some((e) => (e.stateTransitions.get(STATE.waitForBodySlot) ?? 0) > 0)).toBe(true);
        // The entry of no permit went with its slot in one write once the body ended (the slot alone,
        // Release Body Slot, would mean the permit was still held).
        for (const e of executions.filter((x) => x.status === 'SUCCEEDED')) {
          expect(e.stateTransitions.get(STATE.releaseBodySlotAndEntry)).toBe(1);
          expect(e.stateTransitions.get(STATE.releaseBodySlot)).toBeUndefined();
        }
        await sim.idle();
        expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
        expect(await bodySlots(sim)).toEqual({ bodiesRunning: 0, marked: 0, bodyLimit: 5 });
      });
    },
  );
});

test('above the count, a wait for a slot outlasts the fixed budget: its tries back off to a minute apart, and it gets the slot a body frees after 13 minutes', async () => {
  // Two bodies of 800 s hold both slots (their permits went back at the interval); a third execution
  // takes the free permit and waits for a slot. Every second, its 222 tries would end after 222 s
  // (SemaphoreAcquireTimeout); backing off by 1.2 up to 60 s apart, they last about 3.4 hours.
  const { stack, workflow, workFunctionId } = workflowStack({
    rateLimit: RateLimit.of(1, Duration.seconds(2)),
    concurrencyLimit: 2,
    pollInterval: Duration.seconds(1),
    reconcilerScheduleEnabled: false,
  });
  const work = new WorkTracker((input) => input.seconds);
  // A hundredth of real time: the 800 s bodies take 8 s.
  await simulate(stack, { timeScale: 0.01, schedules: false, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const long = [sim.startExecution(sm, { seconds: 800 }), sim.startExecution(sm, { seconds: 800 })];
    await until(() => work.starts.length === 2, 'both long bodies to start');
    const waiter = sim.startExecution(sm, { seconds: 1 });
    const [first, second, waited] = await Promise.all([...long.map((e) => e.done), waiter.done]);

    expect([first.status, second.status, waited.status]).toEqual(['SUCCEEDED', 'SUCCEEDED', 'SUCCEEDED']);
    const firstEnd = Math.min(...long.map((e) => work.startedAt.get(e.arn)!)) + 800_000;
    const waiterStart = work.startedAt.get(waited.arn)!;
    // It started once a slot came free, at most a pause of 60 s (and the simulation's jitter) later.
    expect(waiterStart).toBeGreaterThanOrEqual(firstEnd);
    expect(waiterStart - firstEnd).toBeLessThan(75_000);
    expect(work.maxInside).toBe(2);
    // Far fewer tries than a try a second: 13 minutes took a few dozen, within the budget.
    const tries = waited.stateTransitions.get(STATE.waitForBodySlot)!;
    expect(tries).toBeGreaterThan(20);
    expect(tries).toBeLessThan(40);
    expect(waited.historyEvents).toBeLessThan(2_000);
    await sim.idle();
    expect(await bodySlots(sim)).toEqual({ bodiesRunning: 0, marked: 0, bodyLimit: 2 });
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});

test('above the count, a run stopped in its body after its interval and redriven: the guard takes a permit into the entry that kept its slot, in one write', async () => {
  // X works 180 s on its first run: its permit goes back at 60 s while its body runs on in its slot (an
  // entry of no permit). Stopped at 70 s and redriven, its body starts again: the redrive guard takes a
  // permit into that entry (a redrive counts as an acquisition) without ever letting go of the slot. Y,
  // started then, waits for the rate: its body never starts within 60 s of X's second start.
  const { stack, workflow, workFunctionId } = workflowStack({
    rateLimit: RateLimit.of(1, Duration.seconds(60)),
    concurrencyLimit: 2,
    reconcilerScheduleEnabled: false,
  });
  // X's second run works 30 s: its entry is read while that body runs.
  const work = new WorkTracker((input, run) => (input.x ? (run === 1 ? 180 : 30) : 1));
  await simulate(stack, { timeScale: 0.1, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const x = sim.startExecution(sm, { x: true }, { name: 'x' });
    await until(async () => (await lockItem(sim))?.[x.holderId]?.M?.[HOLDER_PERMITS]?.N === '0', "X's permit to go back at the interval");
    x.abort();
    await x.done;
    const before = (await lockItem(sim))!;
    expect([before[PERMITS_IN_USE].N, before[BODIES_RUNNING].N]).toEqual(['0', '1']);
    const redriven = sim.redriveExecution(x.arn);
    await until(async () => (await lockItem(sim))?.[x.holderId]?.M?.[HOLDER_REDRIVE_COUNT]?.N === '1', 'the redrive guard to take a permit for the new run');
    const after = (await lockItem(sim))!;
    // One permit again (no `permits` field), the same slot (never given back: bodiesRunning stayed 1),
    // the entry claimed for the new run, and a fencing token drawn for it.
    expect(after[x.holderId].M).toMatchObject({ [HOLDER_IN_BODY]: { N: '1' }, [HOLDER_CLAIMED]: { BOOL: true } });
    expect(after[x.holderId].M![HOLDER_PERMITS]).toBeUndefined();
    expect([after[PERMITS_IN_USE].N, after[BODIES_RUNNING].N]).toEqual(['1', '1']);
    expect(Number(after[FENCING_TOKEN].N)).toBe(Number(before[FENCING_TOKEN].N) + 1);
    const y = sim.startExecution(sm, { y: true }, { name: 'y' });
    const [xAgain, yDone] = await Promise.all([redriven, y.done]);

    expect([xAgain.status, yDone.status]).toEqual(['SUCCEEDED', 'SUCCEEDED']);
    expect(work.byExecution.get(x.arn)).toBe(2);
    expect(work.startedAt.get(yDone.arn)! - work.starts[1]).toBeGreaterThanOrEqual(60_000);
    // After the body, the entry held a permit: the slot alone went, then the permit after the interval.
    expect(xAgain.stateTransitions.get(STATE.releaseBodySlot)).toBe(1);
    expect(xAgain.stateTransitions.get(STATE.holdAfterRedrive)).toBe(1);
    await sim.idle();
    expect(await bodySlots(sim)).toEqual({ bodiesRunning: 0, marked: 0, bodyLimit: 2 });
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});

test.each([WaitStrategy.QUEUE, WaitStrategy.POLLING])(
  '%s: without a concurrency limit only the starts are bounded: bodies longer than the interval do not slow the rate',
  async (waitStrategy) => {
    const { stack, workflow, workFunctionId } = workflowStack({
      rateLimit: RateLimit.of(3, Duration.seconds(10)),
      waitStrategy,
      pollInterval: Duration.seconds(1),
      reconcilerScheduleEnabled: false,
    });
    const work = new WorkTracker(() => 40);
    // A tenth of real time: the bodies' starts are Lambda invocations, whose CPU time counts ten times.
    await simulate(stack, { timeScale: 0.1, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const executions = Array.from({ length: 9 }, (_, i) => sim.startExecution(sm, { i }));
      await Promise.all(executions.map((e) => e.done));

      expect(executions.every((e) => e.status === 'SUCCEEDED')).toBe(true);
      expect(executions.map((e) => e.output)).toEqual(executions.map((_, i) => ({ worked: true, echo: { i } })));
      // Never 4 starts in any 10 s, but the 40 s bodies overlap: 3 a wave, a wave every interval (plus a
      // poll or a hand-off), where holding each permit for its body would start 3 per 40 s.
      expect(mostInAnyWindow(work.starts, 10_000)).toBeLessThanOrEqual(3);
      expect(work.maxInside).toBeGreaterThan(3);
      const span = (Math.max(...work.starts) - Math.min(...work.starts)) / 1000;
      // Three waves, 10 s apart (40 s of slack for a busy machine): holding each permit for its body
      // would need at least 80 s (the next test).
      expect(span).toBeGreaterThanOrEqual(20);
      expect(span).toBeLessThan(60);
      // Each permit went back beside its body, once the interval had passed.
      for (const e of executions) {
        expect(e.stateTransitions.get(STATE.holdForRate)).toBe(1);
        expect(e.stateTransitions.get(STATE.rateIntervalReleased)).toBe(1);
        expect(e.stateTransitions.get(STATE.holdAfterRedrive)).toBeUndefined();
      }
      await sim.idle();
      expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
    });
  },
);

test('with a concurrency limit at the rate\'s count, the count also bounds the bodies at once: bodies longer than the interval start fewer', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({
    rateLimit: RateLimit.of(3, Duration.seconds(10)),
    concurrencyLimit: 3,
    reconcilerScheduleEnabled: false,
  });
  const work = new WorkTracker(() => 40);
  await simulate(stack, { timeScale: 0.05, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const executions = Array.from({ length: 9 }, (_, i) => sim.startExecution(sm, { i }));
    await Promise.all(executions.map((e) => e.done));

    expect(executions.every((e) => e.status === 'SUCCEEDED')).toBe(true);
    // A permit is held for the longer of the body (40 s) and the interval (10 s): 3 at once, and so
    // 3 starts per 40 s, not per 10 s.
    expect(work.maxInside).toBe(3);
    expect(mostInAnyWindow(work.starts, 39_000)).toBe(3);
    const span = (Math.max(...work.starts) - Math.min(...work.starts)) / 1000;
    expect(span).toBeGreaterThanOrEqual(80);
    await sim.idle();
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});

test('the reconciler, the client and the CLI tell the waits the rate causes: the queue and the permits the rate holds', async () => {
  // A long interval (5 minutes, 3 s of real time): the sweep must see the first two still inside it.
  const { stack, workflow, workFunctionId } = workflowStack({ rateLimit: RateLimit.of(2, Duration.minutes(5)), reconcilerScheduleEnabled: false });
  const work = new WorkTracker(() => 1);
  await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const client = new SemaphoreClient({ tableName: sim.tableName('WorkflowLockTable'), dynamodb: sim.db.client });
    const executions = Array.from({ length: 4 }, (_, i) => sim.startExecution(sm, { i }));
    /** The per-lock metrics of the reconciler's last sweep. */
    const sweep = async () => {
      await sim.invokeFunction('WorkflowReconcilerFunction', {});
      const lines = (sim.lambdaLogs.get([...sim.lambdaLogs.keys()].find((id) => id.startsWith('WorkflowReconcilerFunction'))!) ?? [])
        .filter((l) => l.includes('"LockName"'))
        .map((l) => JSON.parse(l));
      return lines[lines.length - 1];
    };

    // Two bodies ran and ended; the rate holds their permits for the rest of the interval, and two wait.
    await until(async () => work.runs === 2 && work.inside === 0 && (await client.status(LOCK)).waiting === 2, 'two bodies done, two queued');
    const during = await sweep();
    expect(during).toMatchObject({ LockName: LOCK, PermitsInUse: 2, Holders: 2, Queued: 2, PermitsHeldForRate: 2, WaitingForRate: 2 });
    expect(during._aws.CloudWatchMetrics[0].Metrics.map((m: { Name: string }) => m.Name)).toEqual([
      'PermitsInUse',
      'Holders',
      'Queued',
      'PermitsHeldForRate',
      'WaitingForRate',
    ]);
    expect(await client.status(LOCK)).toMatchObject({ waiting: 2, permitsHeldForRate: 2, waitingForRate: 2 });
    const out: string[] = [];
    const io = { stdout: (l: string) => out.push(l), stderr: () => undefined, env: cliEnv(sim) };
    expect(await main(['status', LOCK], io)).toBe(0);
    expect(out[0]).toBe(`${LOCK}: 2 of 2 permits in use, each held at least 300s (the lock's rate), 2 still inside that interval, 2 executions queued (2 for the rate)`);

    await Promise.all(executions.map((e) => e.done));
    expect(executions.every((e) => e.status === 'SUCCEEDED')).toBe(true);
    // The last acquisitions' interval passes after their bodies: their executions end with it.
    await sim.idle();
    expect(await sweep()).toMatchObject({ PermitsInUse: 0, Holders: 0, Queued: 0, PermitsHeldForRate: 0, WaitingForRate: 0 });
  });
});

describe('scenarios, under DynamoDB\'s capacity rules', () => {
  /**
   * The faults of the fault scenarios: failing bodies, executions stopped inside their body and at
   * random moments (waiting, acquiring, releasing at the interval), lost, duplicated and late events (a
   * lost one leaves its permit to the reconciler, which holds it for the interval too), lost wake-ups,
   * throttling, stale reads.
   */
  const FAULTS = {
    failureRate: 0.1,
    abortInsideRate: 0.1,
    abortRate: 0.05,
    lostEventRate: 0.1,
    lostWakeUpRate: 0.1,
    duplicateEventRate: 0.3,
    maxEventDelaySeconds: 20,
    dynamoFaults: { throttleRate: 0.05 },
    capacity: { partitionLimits: true },
    staleReads: { windowSeconds: 10, rate: 0.3 },
    extendHorizon: true,
  };

  const rateSubject = (count: number, intervalSeconds: number, props: Parameters<typeof demoSubject>[1] = {}) =>
    demoSubject(count, { rateLimit: RateLimit.of(count, Duration.seconds(intervalSeconds)), ...props });
  /** The strategy under faults: the queue checking its wait every minute, or polling. */
  const strategyProps = (waitStrategy: WaitStrategy) =>
    waitStrategy === WaitStrategy.QUEUE ? { queueCheckInterval: Duration.seconds(60) } : { waitStrategy };
  /** Every one of `executions` ended, and the faults struck: some failed, some were stopped. */
  const expectFaultsStruck = (result: Awaited<ReturnType<typeof runScenario>>, executions: number) => {
    expect(result.failed).toBeGreaterThan(0);
    expect(result.aborted).toBeGreaterThan(0);
    expect(result.succeeded + result.failed + result.aborted).toBe(executions);
  };

  test.each([WaitStrategy.QUEUE, WaitStrategy.POLLING])(
    '%s: 10%% failing and 10%% stopped bodies, random stops, lost, duplicated and delayed events, lost wake-ups, throttling: every invariant, the rate included',
    async (waitStrategy) => {
      const rate = { count: 4, intervalSeconds: 10 };
      const result = await runScenario(
        rateSubject(4, 10, strategyProps(waitStrategy)),
        {
          executions: 40,
          limit: 4,
          workSeconds: 5,
          timeScale: 0.02,
          rate,
          seed: 3,
          ...FAULTS,
        },
      );

      expect(brokenInvariants(result, 4)).toEqual([]);
      expect(result.mostAdmissionsInInterval).toBe(4);
      expectFaultsStruck(result, 40);
    },
  );

  test.each([WaitStrategy.QUEUE, WaitStrategy.POLLING])(
    '%s: a rate alone with bodies three times its interval, failing and stopped bodies, random stops, lost, duplicated and delayed events, lost wake-ups, throttling: every invariant',
    async (waitStrategy) => {
      const rate = { count: 4, intervalSeconds: 10 };
      // No concurrency limit: `limit` is only the scenario's bound on the bodies at once (none here).
      const result = await runScenario(rateSubject(4, 10, { concurrencyLimit: undefined, ...strategyProps(waitStrategy) }), {
        executions: 40,
        limit: 40,
        workSeconds: 30,
        timeScale: 0.02,
        rate,
        seed: 5,
        ...FAULTS,
      });

      expect(brokenInvariants(result, 40)).toEqual([]);
      expect(result.mostAdmissionsInInterval).toBe(4);
      // The bodies overlap: holding each permit for its body would keep them to 4 at once.
      expect(result.maxInside).toBeGreaterThan(4);
      expectFaultsStruck(result, 40);
    },
  );

  test.each([WaitStrategy.QUEUE, WaitStrategy.POLLING])(
    '%s: body slots beside the rate, with failing and stopped bodies, random stops, lost, duplicated and delayed events, lost wake-ups, throttling: every invariant',
    async (waitStrategy) => {
      const rate = { count: 4, intervalSeconds: 10 };
      const result = await runScenario(
        demoSubject(2, { rateLimit: RateLimit.of(4, Duration.seconds(10)), pollInterval: Duration.seconds(2), ...strategyProps(waitStrategy) }),
        {
          executions: 40,
          limit: 2,
          workSeconds: 5,
          timeScale: 0.02,
          rate,
          seed: 5,
          ...FAULTS,
        },
      );

      // Never more than 2 bodies at once, nor 4 starts in 10 s; the monitor saw the body slots' count
      // match their marks throughout, and nothing is left held.
      expect(brokenInvariants(result, 2)).toEqual([]);
      expect(result.maxInside).toBe(2);
      expectFaultsStruck(result, 40);
    },
  );

  test.each([WaitStrategy.QUEUE, WaitStrategy.POLLING])(
    '%s: a concurrency limit above the rate, with failing and stopped bodies, random stops, lost, duplicated and delayed events, lost wake-ups, throttling: every invariant',
    async (waitStrategy) => {
      const rate = { count: 3, intervalSeconds: 10 };
      const result = await runScenario(
        demoSubject(4, { rateLimit: RateLimit.of(3, Duration.seconds(10)), pollInterval: Duration.seconds(2), ...strategyProps(waitStrategy) }),
        {
          executions: 40,
          limit: 4,
          workSeconds: 20,
          timeScale: 0.02,
          rate,
          seed: 5,
          ...FAULTS,
        },
      );

      // 20 s bodies at 3 starts per 10 s would need 6 at once: never more than 4 (no entry of a body slot
      // is left behind either: the slot of an entry of no permit counts as held), nor 4 starts in 10 s.
      expect(brokenInvariants(result, 4)).toEqual([]);
      expect(result.maxInside).toBe(4);
      expectFaultsStruck(result, 40);
    },
  );
});

test('the CLI and the client on a rate-limited lock: a lease at least the interval, a release that holds the permit until it has passed', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({ rateLimit: RateLimit.of(2, Duration.seconds(3)), reconcilerScheduleEnabled: false });
  const work = new WorkTracker(() => 0.1);
  // The reconciler would judge the client's real-time leases by the simulation's faster clock.
  await simulate(stack, { schedules: false, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const done = await sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflow.stateMachine)), {}).done;
    expect(done.status).toBe('SUCCEEDED');
    const tableName = sim.tableName('WorkflowLockTable');
    const client = new SemaphoreClient({ tableName, dynamodb: sim.db.client });

    // The workflow's acquire recorded its rate on the lock; the client's lease is at least its interval.
    const before = Date.now();
    const lease = await client.acquire(LOCK, { leaseSeconds: 1 });
    expect(lease).toBeDefined();
    expect(lease!.expiresAt - before).toBeGreaterThanOrEqual(3000);
    const out: string[] = [];
    const err: string[] = [];
    const io = { stdout: (l: string) => out.push(l), stderr: (l: string) => err.push(l), env: cliEnv(sim) };
    expect(await main(['status', LOCK, '--json'], io)).toBe(0);
    const status = JSON.parse(out.join('\n'));
    expect(status).toMatchObject({ permitsInUse: 1, limit: 2, rateIntervalSeconds: 3, permitsHeldForRate: 1 });
    expect(status.holders[0].rateHoldEndsAt - Date.parse(status.holders[0].acquiredAt)).toBe(3000);
    out.length = 0;
    expect(await main(['status', LOCK], io)).toBe(0);
    expect(out[0]).toBe(`${LOCK}: 1 of 2 permits in use, each held at least 3s (the lock's rate), 1 still inside that interval`);
    expect(out[1]).toMatch(/RATE HOLD$/);
    expect(out[2]).toMatch(/ at least [123]s$/);

    // A renewal to less than the interval never ends the lease before the interval has passed.
    const renewedTo = await client.renew(LOCK, lease!.leaseId, 1);
    expect(renewedTo! - before).toBeGreaterThanOrEqual(3000);

    // Released at once, it holds the permit until 3 s after the acquire, and says so.
    const released = Date.now();
    expect(await main(['release', LOCK, lease!.leaseId], io)).toBe(0);
    expect(Date.now() - before).toBeGreaterThanOrEqual(3000);
    expect(Date.now() - released).toBeGreaterThan(1500);
    expect(err.join('\n')).toMatch(/holding the permit \ds more: the lock's rate counts every acquisition for its interval/);
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);

    // A lease whose interval has passed still holds its permit, but no longer for the rate.
    const second = await client.acquire(LOCK, { leaseSeconds: 10 });
    await new Promise((resolve) => setTimeout(resolve, 3100));
    out.length = 0;
    expect(await main(['status', LOCK], io)).toBe(0);
    expect(out[0]).toBe(`${LOCK}: 1 of 2 permits in use, each held at least 3s (the lock's rate), 0 still inside that interval`);
    expect(out[2]).toMatch(/ interval passed$/);
    expect(await client.release(LOCK, second!.leaseId)).toBe(true);
  });
});

test('executions and client leases at once, in real time: the rate counts both in the same windows', async () => {
  const interval = 4000;
  const rateLimit = RateLimit.of(2, Duration.seconds(interval / 1000));
  const { stack, workflow, workFunctionId } = workflowStack({ rateLimit, reconcilerScheduleEnabled: false });
  const work = new WorkTracker(() => 0.2);
  // In real time (a time scale of 1) the executions' clock is the client's: their windows are the same.
  await simulate(stack, { timeScale: 1, schedules: false, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    // One execution first, so that the lock records its rate before the client reads it.
    const first = sim.startExecution(sm, { i: 0 });
    await until(async () => (await lockState(sim))[0]?.permitsInUse === 1, 'the first execution\'s acquire');
    const client = new SemaphoreClient({ tableName: sim.tableName('WorkflowLockTable'), dynamodb: sim.db.client });
    const clientAcquisitions: number[] = [];
    const lease = async (): Promise<void> => {
      const held = await client.acquire(LOCK, { leaseSeconds: 1, waitSeconds: 60, pollSeconds: 0.5 });
      expect(held).toBeDefined();
      clientAcquisitions.push(Date.now());
      expect(held!.expiresAt - Date.now()).toBeGreaterThan(interval - 500);
      // Released at once: the release holds the permit until the interval has passed.
      expect(await client.release(LOCK, held!.leaseId)).toBe(true);
    };
    const executions = [first, ...Array.from({ length: 3 }, (_, i) => sim.startExecution(sm, { i: i + 1 }))];
    await Promise.all([...executions.map((e) => e.done), lease(), lease()]);

    expect(executions.map((e) => e.status)).toEqual(Array(4).fill('SUCCEEDED'));
    expect(clientAcquisitions).toHaveLength(2);
    const all = [...work.starts, ...clientAcquisitions];
    // Six acquisitions at 2 per 4 s: three windows. Each time is taken a little after its acquire (a
    // body's start, a client's return), so the windows are checked 0.2 s short of the interval.
    expect(mostInAnyWindow(all, interval - 200)).toBe(2);
    expect(Math.max(...all) - Math.min(...all)).toBeGreaterThanOrEqual(2 * interval - 200);
    await sim.idle();
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});

test.each([true, false])(
  'a CLI lease first on a brand-new lock (--rate-interval given: %s): the rate counts it only once the lock records the interval',
  async (named) => {
    const interval = 4000;
    const rateLimit = RateLimit.of(2, Duration.seconds(interval / 1000));
    const { stack, workflow, workFunctionId } = workflowStack({ rateLimit, reconcilerScheduleEnabled: false });
    const work = new WorkTracker(() => 0.2);
    // In real time (a time scale of 1) the executions' clock is the CLI's: their windows are the same.
    await simulate(stack, { timeScale: 1, schedules: false, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const out: string[] = [];
      const err: string[] = [];
      const io = { stdout: (l: string) => out.push(l), stderr: (l: string) => err.push(l), env: cliEnv(sim) };
      // Two leases before any execution has acquired: the lock item does not exist yet.
      expect(await lockItem(sim)).toBeUndefined();
      const rate = named ? ['--rate-interval', '4s'] : [];
      const leases: Array<{ leaseId: string; at: number }> = [];
      for (let i = 0; i < 2; i++) {
        out.length = 0;
        expect(await main(['acquire', LOCK, '--limit', '2', '--lease', '10s', ...rate, '--json'], io)).toBe(0);
        // When the lease took its permit: the time its entry records, which the rate counts from (the
        // clock after `main` returns can be later by as long as a busy machine takes to answer).
        const leaseId: string = JSON.parse(out[0]).leaseId;
        leases.push({ leaseId, at: Date.parse((await lockItem(sim))![leaseId].M![HOLDER_ACQUIRED_AT].S!) });
      }
      expect((await lockItem(sim))?.[RATE_INTERVAL]).toEqual(named ? { N: '4' } : undefined);
      // Released at once, beside two executions that start now.
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const releases = leases.map((l) => main(['release', LOCK, l.leaseId], io));
      const executions = [0, 1].map((i) => sim.startExecution(sm, { i }));
      expect(await Promise.all(releases)).toEqual([0, 0]);
      await Promise.all(executions.map((e) => e.done));
      expect(executions.map((e) => e.status)).toEqual(['SUCCEEDED', 'SUCCEEDED']);
      const all = [...leases.map((l) => l.at), ...work.starts];
      if (named) {
        // The releases held the permits for the interval: the executions started after it.
        expect(err.join('\n')).toMatch(/holding the permit \ds more/);
        expect(mostInAnyWindow(all, interval - 200)).toBe(2);
      } else {
        // The window the README names: the releases gave the permits back at once, and both executions
        // started inside the leases' interval.
        expect(mostInAnyWindow(all, interval - 200)).toBe(4);
      }
      // The executions' acquires record the workflow's interval either way.
      expect((await lockItem(sim))?.[RATE_INTERVAL]).toEqual({ N: '4' });
      await sim.idle();
      expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
    });
  },
);

test('the CLI and the client on a lock with body slots: a lease takes a slot too, and holds it until it releases', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({
    rateLimit: RateLimit.of(3, Duration.seconds(2)),
    concurrencyLimit: 1,
    pollInterval: Duration.seconds(1),
    reconcilerScheduleEnabled: false,
  });
  const work = new WorkTracker((input) => input.seconds ?? 0.1);
  // In real time: the client's clock and the simulation's agree.
  await simulate(stack, { timeScale: 1, schedules: false, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    expect((await sim.startExecution(sm, {}).done).status).toBe('SUCCEEDED');
    const tableName = sim.tableName('WorkflowLockTable');
    const client = new SemaphoreClient({ tableName, dynamodb: sim.db.client });

    // The workflow's body recorded the lock's body limit; a lease takes the one slot.
    const lease = await client.acquire(LOCK, { leaseSeconds: 60 });
    expect(lease).toBeDefined();
    expect(await client.status(LOCK)).toMatchObject({ bodyLimit: 1, bodiesRunning: 1 });
    const out: string[] = [];
    const io = { stdout: (l: string) => out.push(l), stderr: () => undefined, env: cliEnv(sim) };
    expect(await main(['status', LOCK], io)).toBe(0);
    expect(out[0]).toMatch(/; 1 of 1 body slots taken$/);

    // An execution takes one of the rate's free permits, but its body waits for the lease's slot.
    const waiting = sim.startExecution(sm, {});
    await until(async () => (await client.status(LOCK)).permitsInUse === 2, 'the second execution to hold a permit');
    await sim.sleep(3);
    expect(work.starts).toHaveLength(1);
    expect(await client.release(LOCK, lease!.leaseId)).toBe(true);
    expect((await waiting.done).status).toBe('SUCCEEDED');
    expect(work.starts).toHaveLength(2);
    expect(waiting.stateTransitions.get(STATE.waitForBodySlot)).toBeGreaterThan(0);

    // While a body runs, a client finds every slot taken, though permits are free.
    await sim.idle();
    const running = sim.startExecution(sm, { seconds: 3 });
    await until(() => work.inside === 1, 'a body to run');
    expect(await client.acquire(LOCK, { waitSeconds: 0 })).toBeUndefined();
    expect(await client.status(LOCK)).toMatchObject({ permitsInUse: 1, bodiesRunning: 1 });
    expect((await running.done).status).toBe('SUCCEEDED');
    await sim.idle();
    expect(await bodySlots(sim)).toEqual({ bodiesRunning: 0, marked: 0, bodyLimit: 1 });
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});

test('the CLI and the client beside a concurrency limit above the rate: a body past its interval holds a slot and no permit', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({
    rateLimit: RateLimit.of(1, Duration.seconds(2)),
    concurrencyLimit: 2,
    pollInterval: Duration.seconds(1),
    reconcilerScheduleEnabled: false,
  });
  const work = new WorkTracker((input) => input.seconds);
  // In real time: the client's clock and the simulation's agree.
  await simulate(stack, { timeScale: 1, schedules: false, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const tableName = sim.tableName('WorkflowLockTable');
    const client = new SemaphoreClient({ tableName, dynamodb: sim.db.client });
    const running = sim.startExecution(sm, { seconds: 8 });
    // Once the interval has passed, the permit is back and the body runs on in its slot.
    await until(async () => (await client.status(LOCK)).holders[0]?.permits === 0, 'the permit to go back at the interval');
    expect(work.inside).toBe(1);
    expect(await client.status(LOCK)).toMatchObject({
      permitsInUse: 0,
      bodyLimit: 2,
      bodiesRunning: 1,
      holders: [{ id: running.holderId, permits: 0 }],
    });
    const out: string[] = [];
    const io = { stdout: (l: string) => out.push(l), stderr: () => undefined, env: cliEnv(sim) };
    expect(await main(['status', LOCK], io)).toBe(0);
    expect(out[0]).toMatch(/^TestStack\/Workflow: 0 of 1 permits in use.*; 1 of 2 body slots taken$/);
    expect(out.find((l) => l.includes(running.holderId))).toMatch(/^execution\s+\S+\s+0\s/);

    // The free permit and the second slot go to a lease; the rate then refuses another.
    const lease = await client.acquire(LOCK, { leaseSeconds: 60 });
    expect(lease).toBeDefined();
    expect(await client.status(LOCK)).toMatchObject({ permitsInUse: 1, bodiesRunning: 2 });
    expect(await client.acquire(LOCK, { waitSeconds: 0 })).toBeUndefined();
    expect(await client.release(LOCK, lease!.leaseId)).toBe(true);
    expect((await running.done).status).toBe('SUCCEEDED');
    // The body's end removed the entry of no permit with its slot, in one write.
    expect(running.stateTransitions.get(STATE.releaseBodySlotAndEntry)).toBe(1);
    expect(running.stateTransitions.get(STATE.releaseBodySlot)).toBeUndefined();
    await sim.idle();
    expect(await bodySlots(sim)).toEqual({ bodiesRunning: 0, marked: 0, bodyLimit: 2 });
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});

test.each([undefined, 3])('idempotent and rate-limited (concurrencyLimit %s): a repeat returns the stored result without an acquisition; the others keep the rate', async (concurrencyLimit) => {
  const { stack, workflow, workFunctionId } = workflowStack({
    rateLimit: RateLimit.of(2, Duration.seconds(5)),
    concurrencyLimit,
    idempotency: { key: IdempotencyKey.fromFields('$.id') },
    reconcilerScheduleEnabled: false,
  });
  // Above the count, bodies four times the interval: three run at once, more than the rate's two (at a
  // tenth of real time, so that the hand-offs' CPU time stays far below the interval).
  const work = new WorkTracker(() => (concurrencyLimit === undefined ? 0.5 : 20));
  const timeScale = concurrencyLimit === undefined ? 0.01 : 0.1;
  await simulate(stack, { timeScale, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const first = await Promise.all(Array.from({ length: 6 }, (_, id) => sim.startExecution(sm, { id }).done));
    const repeat = await sim.startExecution(sm, { id: 3 }).done;

    expect(first.map((e) => e.status)).toEqual(Array(6).fill('SUCCEEDED'));
    expect(repeat.status).toBe('SUCCEEDED');
    expect(repeat.output).toEqual(first[3].output);
    expect(work.starts).toHaveLength(6);
    expect(mostInAnyWindow(work.starts, 5_000)).toBe(2);
    expect(first.every((e) => e.stateTransitions.get(STATE.holdForRate) === 1)).toBe(true);
    if (concurrencyLimit !== undefined) {
      expect(work.maxInside).toBe(3);
      // Each entry of no permit went with its slot in one write (the slot alone would mean a permit held).
      expect(first.map((e) => [e.stateTransitions.get(STATE.releaseBodySlotAndEntry), e.stateTransitions.get(STATE.releaseBodySlot)])).toEqual(
        first.map(() => [1, undefined]),
      );
      expect(await bodySlots(sim)).toEqual({ bodiesRunning: 0, marked: 0, bodyLimit: 3 });
    }
    await sim.idle();
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});
