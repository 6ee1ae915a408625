import { App, CfnParameter, Duration, Stack } from 'aws-cdk-lib';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { main } from '../client/cli';
import { demoSubject } from '../demo/run';
import { brokenInvariants, LockMonitor, runScenario, Simulator } from '../simulator';
import { ConcurrencyControlledWorkflow, IdempotencyKey, RateLimit, SemaphoreTable, WaitStrategy } from '../src';
import { lockState, logicalId, simulate, stateMachineLogicalId, until, WORK_FUNCTION_TIMEOUT, WorkTracker, workflowStack } from './helpers';
import { HOLDER_ACQUIRED_AT, HOLDER_EXTRA_PERMITS, HOLDER_PERMITS, HOLDER_REDRIVE_COUNT, isTicketKey, TICKET_WAITER } from '../src/private/lock-schema';
import { STATE } from '../src/private/state-names';

/*
 * Weighted permits (`permits`): an execution takes several of the lock's permits at once, runs its
 * body only while it holds them all, and every release gives back exactly what it took.
 */

const LOCK = 'TestStack/Workflow';

describe('validation at synth', () => {
  test.each([
    [{ permits: 0 }, /`permits` must be an integer from 1 to 100 .*got: 0/],
    [{ permits: 2.5, concurrencyLimit: 5 }, /`permits` must be an integer from 1 to 100 .*got: 2.5/],
    [{ permits: 101, concurrencyLimit: 1000 }, /`permits` must be an integer from 1 to 100 .*got: 101/],
    [{ permits: 4, concurrencyLimit: 3 }, /`permits` \(4\) must be at most `concurrencyLimit` \(3\)/],
    [{ permits: 2 }, /`permits` \(2\) must be at most `concurrencyLimit` \(1\)/],
    [{ permits: 2, concurrencyLimit: 4, rateLimit: RateLimit.perSecond(4) }, /`permits` and `rateLimit` cannot be combined yet/],
  ])('a bad weight is refused, naming the value: %#', (props, message) => {
    expect(() => workflowStack(props)).toThrow(message);
  });

  test('a deploy-time token for the permits, or for the limit beside them, is refused: the gate is computed at synth', () => {
    const app = new App();
    const stack = new Stack(app, 'S');
    const param = new CfnParameter(stack, 'P', { type: 'Number' });
    const body = new sfn.Pass(stack, 'Body');
    expect(() => new ConcurrencyControlledWorkflow(stack, 'A', { body, concurrencyLimit: 10, permits: param.valueAsNumber })).toThrow(
      /`permits` must be a number, or JsonPath.numberAt\(...\) to read it from the input, got a deploy-time token/,
    );
    expect(() => new ConcurrencyControlledWorkflow(stack, 'B', { body: new sfn.Pass(stack, 'Body2'), concurrencyLimit: param.valueAsNumber, permits: 2 })).toThrow(
      /`concurrencyLimit` must be a number, or JsonPath.numberAt\(...\) to read it from the input, beside `permits`, got a deploy-time token/,
    );
  });

  test('a weight waits in the queue by default; a weight of 1 is no weight at all', () => {
    const definitionOf = (props: Parameters<typeof workflowStack>[0]) => {
      const { stack, workflow } = workflowStack(props);
      return JSON.stringify(stack.resolve((workflow.stateMachine.node.defaultChild as sfn.CfnStateMachine).definitionString));
    };
    const weighted = definitionOf({ permits: 3, concurrencyLimit: 5 });
    expect(weighted).toContain(STATE.takeTicket);
    expect(weighted).toContain(STATE.registerCollector);
    expect(weighted).not.toContain(STATE.drawPollDelay);
    expect(weighted).toContain(STATE.handOffOne);
    expect(weighted).toEqual(definitionOf({ permits: 3, concurrencyLimit: 5, waitStrategy: WaitStrategy.QUEUE }));
    expect(definitionOf({ permits: 1, concurrencyLimit: 5 })).toEqual(definitionOf({ concurrencyLimit: 5 }));
  });
});

test('a weight of 3 at limit 7: two bodies at once, each holding 3, every permit given back', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({
    permits: 3,
    waitStrategy: WaitStrategy.POLLING,
    concurrencyLimit: 7,
    pollInterval: Duration.seconds(1),
    reconcilerScheduleEnabled: false,
  });
  const work = new WorkTracker(() => 5);
  await simulate(stack, { timeScale: 0.05, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const executions = Array.from({ length: 6 }, (_, i) => sim.startExecution(sm, { i }));
    await until(async () => (await lockState(sim))[0]?.holders.length === 2, 'two holders');
    const [lock] = await sim.scan('WorkflowLockTable');
    expect(lock.permitsInUse).toEqual({ N: '6' });
    const holder = Object.values(lock).find((v) => v.M?.[HOLDER_PERMITS] !== undefined);
    expect(holder?.M?.[HOLDER_PERMITS]).toEqual({ N: '3' });
    await Promise.all(executions.map((e) => e.done));
    expect(executions.map((e) => e.status)).toEqual(Array(6).fill('SUCCEEDED'));
    expect(work.maxInside).toBe(2);
    await sim.idle();
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});

test('a weight read from the input is checked first: not an integer from 1 to 100 and at most the limit fails with SemaphoreInvalidPermits', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({
    permits: sfn.JsonPath.numberAt('$.weight'),
    waitStrategy: WaitStrategy.POLLING,
    concurrencyLimit: sfn.JsonPath.numberAt('$.limit'),
    reconcilerScheduleEnabled: false,
  });
  const work = new WorkTracker(() => 1);
  await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const bad = [{ limit: 10 }, { weight: 'two', limit: 10 }, { weight: 0, limit: 10 }, { weight: 2.5, limit: 10 }, { weight: 11, limit: 10 }, { weight: 101, limit: 200 }];
    const refused = bad.map((input) => sim.startExecution(sm, input));
    const good = [sim.startExecution(sm, { weight: 4, limit: 10 }), sim.startExecution(sm, { weight: 100, limit: 100 })];
    await Promise.all([...refused, ...good].map((e) => e.done));
    expect(refused.map((e) => [e.status, e.error])).toEqual(Array(bad.length).fill(['FAILED', ConcurrencyControlledWorkflow.INVALID_PERMITS_ERROR]));
    // The cause says what is allowed, and quotes what it got.
    const allowed = 'The permits read from the execution input at $.weight must be an integer from 1 to 100, and at most the concurrency limit';
    expect(refused.map((e) => e.cause)).toEqual([
      ...['got none', 'got: "two"', 'got: 0', 'got: 2.5'].map((got) => `${allowed}, ${got}`),
      'The permits read from the execution input at $.weight must be at most the concurrency limit read from it at $.limit, got: 11 and 10',
      `${allowed}, got: 101`,
    ]);
    expect(good.map((e) => e.status)).toEqual(['SUCCEEDED', 'SUCCEEDED']);
    expect(work.runs).toBe(2);
    await sim.idle();
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});

test.each([WaitStrategy.POLLING, WaitStrategy.QUEUE])('%s: mixed weights 1 to 4 at limit 10, 10%% failing and 10%% stopped bodies, stops at random moments, lost and delayed events, lost wake-ups, throttling: never over 10 by weight, nothing left held', async (waitStrategy) => {
  // The queue's check interval is scaled down as the run is, as in the fault suite: a releaser stopped
  // between its peek and its serve leaves its waiter asleep until the waiter's next check. The run's
  // ideal drain is 75 s, and the horizon's extension goes on while an execution ends in each half of
  // it (37.5 s): a waiter left for the last must check within that.
  const check = waitStrategy === WaitStrategy.QUEUE ? { queueCheckInterval: Duration.seconds(30) } : {};
  const subject = demoSubject(10, { permits: sfn.JsonPath.numberAt('$.weight'), pollInterval: Duration.seconds(2), waitStrategy, ...check });
  const weight = (id: number) => (id % 4) + 1;
  const result = await runScenario(subject, {
    executions: 60,
    limit: 10,
    workSeconds: 5,
    // Polling's CPU counts as simulated time: at 0.02 a machine 3 to 4 times slower reached the horizon
    // (4x the ideal drain) with executions still waiting; at 0.05 the test takes about 10 s.
    timeScale: 0.05,
    seed: 5,
    input: (id) => ({ weight: weight(id) }),
    permits: weight,
    failureRate: 0.1,
    abortInsideRate: 0.1,
    // Stops at any moment: waiting, acquiring, collecting its permits, releasing, handing them on.
    abortRate: 0.1,
    lostEventRate: 0.1,
    lostWakeUpRate: 0.1,
    duplicateEventRate: 0.2,
    maxEventDelaySeconds: 20,
    dynamoFaults: { throttleRate: 0.05 },
    capacity: { partitionLimits: true },
    staleReads: { windowSeconds: 10, rate: 0.3 },
    extendHorizon: true,
  });

  expect(brokenInvariants(result, 10)).toEqual([]);
  // The weights bind: bodies together held more permits than there were bodies, and up to the limit.
  expect(result.maxPermitsInside).toBeGreaterThan(result.maxInside);
  expect(result.maxPermitsInside).toBeGreaterThanOrEqual(9);
  expect(result.failed).toBeGreaterThan(0);
  expect(result.aborted).toBeGreaterThan(0);
  expect(result.succeeded + result.failed + result.aborted).toBe(60);
});

/**
 * Two workflows on one lock of limit 4: a weighted one (3 permits, polling) and one whose executions
 * wait in the queue. When a weighted execution releases with executions queued, it hands its permits
 * to them one at a time (its cleanup too, when it is stopped), and gives back the rest.
 */
function sharedLockStack() {
  const app = new App();
  const stack = new Stack(app, 'TestStack');
  const table = new SemaphoreTable(stack, 'Locks');
  const fn = new lambda.Function(stack, 'WorkFunction', {
    runtime: lambda.Runtime.NODEJS_18_X,
    handler: 'index.handler',
    code: lambda.Code.fromInline('exports.handler = async (event) => event;'),
    timeout: WORK_FUNCTION_TIMEOUT,
  });
  const common = { table, lockName: 'shared', concurrencyLimit: 4, reconcilerScheduleEnabled: false };
  const heavy = new ConcurrencyControlledWorkflow(stack, 'Heavy', {
    ...common,
    body: new tasks.LambdaInvoke(stack, 'Heavy Work', { lambdaFunction: fn, payloadResponseOnly: true }),
    permits: 3,
    waitStrategy: WaitStrategy.POLLING,
    pollInterval: Duration.seconds(1),
  });
  const light = new ConcurrencyControlledWorkflow(stack, 'Light', {
    ...common,
    body: new tasks.LambdaInvoke(stack, 'Light Work', { lambdaFunction: fn, payloadResponseOnly: true }),
    queueCheckInterval: Duration.minutes(10),
  });
  return { stack, heavy, light, tableId: logicalId(table.table.node.defaultChild as any), workFunctionId: logicalId(fn.node.defaultChild as any) };
}

test.each([false, true])(
  'a weighted holder releasing (stopped: %s) while others wait in the queue hands its permits to them one at a time',
  async (stopped) => {
    const { stack, heavy, light, tableId, workFunctionId } = sharedLockStack();
    const work = new WorkTracker((input) => input.seconds);
    const limitOf = () => 4;
    // The heavy body stays inside until the three waiters wait on their tickets (however slow the machine).
    let heavyInside = false;
    const waiting = async (sim: Simulator) =>
      (await sim.scan(tableId)).filter((i) => isTicketKey(i.lockName.S!) && i[TICKET_WAITER] !== undefined).length === 3;
    const handler: typeof work.handler = async (input, context) => {
      if (input.untilQueued) {
        heavyInside = true;
        await until(() => waiting(context.simulator), 'three waiters on their tickets');
        // Stopped meanwhile (the stopped case may come first): its body never starts.
        if (context.signal.aborted) return { worked: false, echo: input };
      }
      return work.handler(input, context);
    };
    await simulate(stack, { timeScale: 0.05, lambdaHandlers: { [workFunctionId]: handler } }, async (sim) => {
      const monitor = new LockMonitor(sim, tableId, limitOf).start(5);
      const heavySm = sim.stateMachine(stateMachineLogicalId(heavy.stateMachine));
      const lightSm = sim.stateMachine(stateMachineLogicalId(light.stateMachine));
      const first = sim.startExecution(heavySm, { seconds: 20, untilQueued: true });
      await until(async () => heavyInside, 'the heavy execution inside');
      // One light execution gets the last permit; three more queue behind it. Its body (120 s) outlasts
      // their hand-offs, so that four are inside at once.
      const lights = Array.from({ length: 4 }, () => sim.startExecution(lightSm, { seconds: 120 }));
      await until(async () => work.inside === 1, 'a light execution inside');
      await until(() => waiting(sim), 'three tickets taken');
      if (stopped) first.abort();
      await Promise.all([first, ...lights].map((e) => e.done));
      await sim.idle();
      await monitor.stop();

      expect(first.status).toBe(stopped ? 'ABORTED' : 'SUCCEEDED');
      expect(lights.map((e) => e.status)).toEqual(Array(4).fill('SUCCEEDED'));
      // The three waiters came in together, one permit each from the heavy holder, not by their checks
      // (every 10 minutes) nor one by one as bodies ended (120 s each).
      const started = [...work.startedAt.entries()].filter(([arn]) => arn !== first.arn).map(([, t]) => t).sort();
      expect(started[3] - started[1]).toBeLessThan(60_000);
      // The releaser: the execution itself, or its cleanup.
      const handsOffOne = (e: { stateTransitions: Map<string, number> }) =>
        [...e.stateTransitions.keys()].some((n) => n.startsWith(STATE.handOffOne));
      const cleanups = [...sim.executions.values()].filter((e) => e.stateMachine !== heavySm && e.stateMachine !== lightSm);
      expect(stopped ? cleanups.some(handsOffOne) : handsOffOne(first)).toBe(true);
      expect(monitor.violations).toEqual([]);
      expect(work.maxInside).toBe(4);
      expect(await lockState(sim, tableId)).toEqual([{ lockName: 'shared', permitsInUse: 0, holders: [] }]);
    });
  },
);

test('the CLI takes several permits with --permits, status shows them, and its release hands them to queued executions one at a time', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 3, reconcilerScheduleEnabled: false });
  const work = new WorkTracker(() => 60);
  // The reconciler would judge the client's real-time leases by the simulation's faster clock.
  await simulate(stack, { schedules: false, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    // An execution records the workflows' limit (3) on the lock.
    expect((await sim.startExecution(sm, {}).done).status).toBe('SUCCEEDED');
    const out: string[] = [];
    const err: string[] = [];
    // The simulator points the SDK's standard configuration (process.env) at itself.
    const env = { ...process.env, CDK_SFN_SEMAPHORE_TABLE: sim.tableName('WorkflowLockTable') };
    const io = { stdout: (l: string) => out.push(l), stderr: (l: string) => err.push(l), env };
    const cli = async (...argv: string[]) => {
      out.length = 0;
      err.length = 0;
      return main(argv, io);
    };

    expect(await cli('acquire', LOCK, '--permits', '0', '--no-wait')).toBe(2);
    expect(err.join('\n')).toContain("--permits must be an integer from 1 to 100, got: '0'");
    expect(await cli('acquire', LOCK, '--permits', '4', '--no-wait')).toBe(1);
    expect(err.join('\n')).toContain('the permits (4) must be at most the limit (3)');
    expect(await cli('acquire', LOCK, '--permits', '3', '--limit', '2', '--no-wait')).toBe(2);
    expect(err.join('\n')).toContain('--permits (3) must be at most --limit (2)');

    expect(await cli('acquire', LOCK, '--permits', '3', '--no-wait', '--json')).toBe(0);
    const { leaseId } = JSON.parse(out.join('\n'));
    expect(await cli('status', LOCK, '--json')).toBe(0);
    expect(JSON.parse(out.join('\n'))).toMatchObject({ permitsInUse: 3, limit: 3, holders: [{ id: leaseId, kind: 'lease', permits: 3 }] });
    expect(await cli('status', LOCK)).toBe(0);
    expect(out[1]).toMatch(/^KIND\s+HOLDER\s+PERMITS\s+OWNER/);
    expect(out[2]).toMatch(new RegExp(`^lease\\s+${leaseId}\\s+3\\s`));

    // Two executions queue behind the lease; its release wakes both, each with one of its permits.
    const queued = [sim.startExecution(sm, { n: 1 }), sim.startExecution(sm, { n: 2 })];
    await until(async () => queued.every((e) => e.stateTransitions.has(STATE.waitInQueue)), 'both executions queued');
    expect(await cli('release', LOCK, leaseId)).toBe(0);
    await Promise.all(queued.map((e) => e.done));
    expect(queued.map((e) => e.status)).toEqual(['SUCCEEDED', 'SUCCEEDED']);
    // Both at once, each with one of the lease's permits (the client runs in real time: a few ms are
    // seconds of the simulation, far below the 60 s bodies).
    const [a, b] = queued.map((e) => work.startedAt.get(e.arn)!);
    expect(Math.abs(a - b)).toBeLessThan(30_000);
    // Woken by the release, not by a timed-out wait (the queue checks every 5 minutes).
    expect(queued.every((e) => !e.stateTransitions.has(STATE.waitInQueueAgain))).toBe(true);
    await sim.idle();
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});

test('a weighted lease that expires, and a weighted execution force-released: the sweep and force-release give back all their permits', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({ permits: 2, concurrencyLimit: 3, reconcilerScheduleEnabled: false });
  const work = new WorkTracker(() => 600);
  await simulate(stack, { schedules: false, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const env = { ...process.env, CDK_SFN_SEMAPHORE_TABLE: sim.tableName('WorkflowLockTable') };
    const out: string[] = [];
    const cli = (...argv: string[]) => {
      out.length = 0;
      return main(argv, { stdout: (l) => out.push(l), stderr: () => undefined, env });
    };

    // A lease of 3 permits (the whole limit) whose holder crashed: the sweep, on the simulation's clock
    // (far faster than the lease's real one), past the lease's 10 s and the 30 s margin, reclaims all three at once.
    expect(await cli('acquire', LOCK, '--permits', '3', '--limit', '3', '--lease', '10s', '--no-wait', '--json')).toBe(0);
    const { leaseId } = JSON.parse(out.join('\n'));
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 3, holders: [leaseId] }]);
    await sim.sleep(120);
    const swept = (await sim.invokeFunction('WorkflowReconcilerFunction', {})) as { reclaimed: Array<{ holder: string }> };
    expect(swept.reclaimed.map((r) => r.holder)).toEqual([leaseId]);
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);

    // An execution of weight 2 inside its body, freed by force: both its permits come back.
    const inside = sim.startExecution(sm, {});
    await until(async () => work.inside === 1, 'the execution inside');
    expect(await lockState(sim)).toMatchObject([{ lockName: LOCK, permitsInUse: 2 }]);
    expect(await cli('force-release', LOCK, inside.arn, '--reason', 'stuck')).toBe(0);
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
    inside.abort();
    await inside.done;
    await sim.idle();
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});

test('a weighted execution past its leaseDuration: the sweep stops it and gives back all its permits, and the next weight gets in', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({
    permits: 2,
    concurrencyLimit: 3,
    leaseDuration: Duration.minutes(2),
    waitStrategy: WaitStrategy.POLLING,
    pollInterval: Duration.seconds(5),
    reconcilerScheduleEnabled: false,
  });
  // The first body would run 10 minutes; the second, 1 s.
  const work = new WorkTracker((input) => (input.long ? 600 : 1));
  await simulate(stack, { schedules: false, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const long = sim.startExecution(sm, { long: true });
    await until(async () => work.inside === 1, 'the long body inside');
    // 2 + 2 > 3: the second waits for the first's two permits.
    const next = sim.startExecution(sm, {});
    await sim.sleep(30);
    expect(work.runs).toBe(1);
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 2, holders: [long.arn] }]);

    // Past the lease (and the sweep's grace period): the sweep stops the execution and frees both permits.
    await sim.sleep(120);
    const swept = (await sim.invokeFunction('WorkflowReconcilerFunction', {})) as { stopped: string[]; reclaimed: Array<{ holder: string }> };
    expect(swept.stopped).toEqual([long.arn]);
    await long.done;
    expect([long.status, long.error]).toEqual(['ABORTED', 'SemaphoreLeaseExpired']);
    expect((await next.done).status).toBe('SUCCEEDED');
    expect(work.runs).toBe(2);
    await sim.idle();
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});

test('a weighted execution stopped with its status event lost: the reconciler\'s sweep gives back all its permits', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({
    permits: 3,
    concurrencyLimit: 4,
    waitStrategy: WaitStrategy.POLLING,
    reconcilerScheduleEnabled: false,
  });
  const work = new WorkTracker(() => 600);
  await simulate(stack, { eventFaults: { lossRate: 1 }, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const stopped = sim.startExecution(sm, {});
    await until(async () => work.inside === 1, 'the execution inside');
    stopped.abort();
    await stopped.done;
    await sim.idle();
    // No cleanup ran: its three permits are still counted.
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 3, holders: [stopped.arn] }]);
    // Past the sweep's grace period for young entries, one sweep frees all three (invoked directly:
    // with every event lost, the schedule's would be lost too).
    await sim.sleep(90);
    await sim.invokeFunction('WorkflowReconciler', {});
    await sim.idle();
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
    // And the lock takes three again.
    const next = await sim.startExecution(sm, {}).done;
    expect(next.status).toBe('SUCCEEDED');
  });
});

test('idempotent and weighted: a repeat returns the stored result without taking permits; the others take theirs', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({
    permits: 2,
    waitStrategy: WaitStrategy.POLLING,
    concurrencyLimit: 3,
    pollInterval: Duration.seconds(1),
    idempotency: { key: IdempotencyKey.fromFields('$.id') },
    reconcilerScheduleEnabled: false,
  });
  const work = new WorkTracker(() => 2);
  await simulate(stack, { timeScale: 0.05, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const first = await Promise.all(Array.from({ length: 4 }, (_, id) => sim.startExecution(sm, { id }).done));
    expect(first.map((e) => e.status)).toEqual(Array(4).fill('SUCCEEDED'));
    expect(work.maxInside).toBe(1);
    const repeat = await sim.startExecution(sm, { id: 2 }).done;
    expect(repeat.status).toBe('SUCCEEDED');
    expect(repeat.output).toEqual(first[2].output);
    expect(work.runs).toBe(4);
    await sim.idle();
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});

describe('the limit from the input', () => {
  test.each([
    [
      'a fixed weight of 3',
      { permits: 3 },
      (_: number) => ({}),
      "The concurrency limit read from the execution input at $.limit must be at least the workflow's permits, 3, got: 2",
    ],
    [
      'a weight of 3 from the input',
      { permits: sfn.JsonPath.numberAt('$.weight') },
      (_: number) => ({ weight: 3 }),
      'The permits read from the execution input at $.weight must be at most the concurrency limit read from it at $.limit, got: 3 and 2',
    ],
  ])('%s at a limit of 5 from the input: one body at a time; a limit of 2 fails with SemaphoreInvalidPermits', async (_name, props, input, cause) => {
    const { stack, workflow, workFunctionId } = workflowStack({
      ...props,
      concurrencyLimit: sfn.JsonPath.numberAt('$.limit'),
      pollInterval: Duration.seconds(1),
      reconcilerScheduleEnabled: false,
    });
    const work = new WorkTracker(() => 3);
    await simulate(stack, { timeScale: 0.05, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      // On a lock item not written yet too: the first acquire would let anything in.
      const tooLow = await sim.startExecution(sm, { ...input(0), limit: 2 }).done;
      expect([tooLow.status, tooLow.error]).toEqual(['FAILED', ConcurrencyControlledWorkflow.INVALID_PERMITS_ERROR]);
      expect(tooLow.cause).toBe(cause);
      const executions = Array.from({ length: 4 }, (_, i) => sim.startExecution(sm, { ...input(i), limit: 5 }));
      await Promise.all(executions.map((e) => e.done));
      expect(executions.map((e) => e.status)).toEqual(Array(4).fill('SUCCEEDED'));
      // 3 + 3 > 5: never two at once.
      expect(work.maxInside).toBe(1);
      await sim.idle();
      expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
    });
  });
});

test('a weighted holder whose queued waiter is gone takes that permit back and hands it to the next', async () => {
  const { stack, heavy, light, tableId, workFunctionId } = sharedLockStack();
  const work = new WorkTracker((input) => input.seconds);
  await simulate(stack, { timeScale: 0.05, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const monitor = new LockMonitor(sim, tableId, () => 4).start(5);
    const heavySm = sim.stateMachine(stateMachineLogicalId(heavy.stateMachine));
    const lightSm = sim.stateMachine(stateMachineLogicalId(light.stateMachine));
    // The heavy body outlasts the steps up to the stop (3 s of real time: a busy machine took more
    // than the 1 s that 20 s gave), and the light holder's outlasts the heavy one's, whose release
    // must be the one that meets the stopped waiter's ticket.
    const first = sim.startExecution(heavySm, { seconds: 60 });
    await until(async () => work.inside === 1, 'the heavy execution inside');
    const inside = sim.startExecution(lightSm, { seconds: 90 });
    await until(async () => work.inside === 2, 'a light execution inside');
    // Two wait in the queue; the first of them is stopped while it waits (its task token closes).
    const gone = sim.startExecution(lightSm, { seconds: 30 });
    await until(async () => gone.stateTransitions.has(STATE.waitInQueue), 'the first waiter queued');
    const next = sim.startExecution(lightSm, { seconds: 30 });
    await until(async () => next.stateTransitions.has(STATE.waitInQueue), 'the second waiter queued');
    gone.abort();
    await gone.done;
    await Promise.all([first, inside, next].map((e) => e.done));
    await sim.idle();
    await monitor.stop();

    expect([first, inside, next].map((e) => e.status)).toEqual(['SUCCEEDED', 'SUCCEEDED', 'SUCCEEDED']);
    expect(work.byExecution.has(gone.arn)).toBe(false);
    expect(first.stateTransitions.get(STATE.takeBackOne)).toBe(1);
    // The permit taken back went to the next waiter with the heavy holder's release, not a check later.
    expect(work.startedAt.get(next.arn)! - (first.stopDate ?? 0)).toBeLessThan(5_000);
    expect(monitor.violations).toEqual([]);
    expect(await lockState(sim, tableId)).toEqual([{ lockName: 'shared', permitsInUse: 0, holders: [] }]);
  });
});

test('redriven while its stopped run\'s release was handing its permits on: the redrive guard takes the whole weight again', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({
    permits: 3,
    concurrencyLimit: 4,
    waitStrategy: WaitStrategy.POLLING,
    reconcilerScheduleEnabled: false,
  });
  // The redriven run's body lasts long enough to be looked at.
  const work = new WorkTracker((_input, run) => (run === 1 ? 30 : 100));
  await simulate(stack, { timeScale: 0.05, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const heavy = sim.startExecution(sm, {});
    await until(async () => work.inside === 1, 'the execution inside');
    // Stopped inside its body; its cleanup (held back here) had handed one of its three permits to
    // a queued holder, as Hand Off One Of Permits does, when the execution is redriven.
    sim.eventFaults = { lossRate: 1 };
    heavy.abort();
    await heavy.done;
    await sim.db.call('UpdateItem', {
      TableName: sim.tableName('WorkflowLockTable'),
      Key: { lockName: { S: LOCK } },
      UpdateExpression: `SET #next = :entry, #holder.${HOLDER_PERMITS} = #holder.${HOLDER_PERMITS} - :one, #holder.${HOLDER_EXTRA_PERMITS} = #holder.${HOLDER_EXTRA_PERMITS} - :one`,
      ExpressionAttributeNames: { '#next': 'lease-waiter', '#holder': heavy.holderId },
      ExpressionAttributeValues: { ':one': { N: '1' }, ':entry': { M: { [HOLDER_ACQUIRED_AT]: { S: new Date(sim.now()).toISOString() } } } },
    });
    sim.eventFaults = {};
    // (It resolves when the redriven run stops.)
    const redriven = sim.redriveExecution(heavy.arn);
    // The guard frees the two permits left, and takes three for the redriven run.
    await until(async () => {
      const [lock] = await sim.scan('WorkflowLockTable');
      return lock[heavy.holderId]?.M?.[HOLDER_PERMITS]?.N === '3';
    }, 'the redriven run holding three permits');
    const [lock] = await sim.scan('WorkflowLockTable');
    expect(lock.permitsInUse).toEqual({ N: '4' });
    expect(lock[heavy.holderId].M?.[HOLDER_REDRIVE_COUNT]).toEqual({ N: '1' });
    expect((await redriven).status).toBe('SUCCEEDED');
    await sim.idle();
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 1, holders: ['lease-waiter'] }]);
  });
});

describe('weighted waiters in the queue', () => {
  test('weights 2, 1, 2, 1, 2, 1 at limit 3: never more than 3 permits inside, every one served, nothing left held', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({
      permits: sfn.JsonPath.numberAt('$.weight'),
      concurrencyLimit: 3,
      waitStrategy: WaitStrategy.QUEUE,
      pollInterval: Duration.seconds(1),
      reconcilerScheduleEnabled: false,
    });
    const work = new WorkTracker(() => 5);
    let permitsInside = 0;
    let mostPermitsInside = 0;
    const handler: typeof work.handler = async (input, context) => {
      permitsInside += input.weight;
      mostPermitsInside = Math.max(mostPermitsInside, permitsInside);
      try {
        return await work.handler(input, context);
      } finally {
        permitsInside -= input.weight;
      }
    };
    await simulate(stack, { timeScale: 0.05, lambdaHandlers: { [workFunctionId]: handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const executions = [2, 1, 2, 1, 2, 1].map((weight, i) => sim.startExecution(sm, { weight, i }));
      await Promise.all(executions.map((e) => e.done));
      expect(executions.map((e) => e.status)).toEqual(Array(6).fill('SUCCEEDED'));
      expect(mostPermitsInside).toBe(3);
      // Heavy waiters were woken with one permit and collected the other. A registration can be refused
      // (another execution collects): that waiter gives its permit back and queues again, so count per
      // execution the registrations that landed against the completions, and the refusals against the give-ups.
      const count = (e: (typeof executions)[number], type: string, ...states: string[]) =>
        e.history.filter((h) => h.type === type && states.includes(h.state ?? h.name ?? '')).length;
      const registered = executions.map((e) => count(e, 'TaskSucceeded', STATE.registerCollector));
      expect(registered.reduce((a, b) => a + b, 0)).toBeGreaterThan(0);
      expect(executions.map((e) => count(e, 'TaskSucceeded', STATE.completePermits, STATE.confirmPermitsComplete))).toEqual(registered);
      expect(executions.map((e) => count(e, 'TaskStateEntered', STATE.giveUpHandedPermit))).toEqual(
        executions.map((e) => count(e, 'TaskFailed', STATE.registerCollector)),
      );
      await sim.idle();
      expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
    });
  });
});

test('first come, first served: a heavy waiter at the head of the queue is not overtaken by light ones that arrive after it', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({
    permits: sfn.JsonPath.numberAt('$.weight'),
    concurrencyLimit: 3,
    waitStrategy: WaitStrategy.QUEUE,
    pollInterval: Duration.seconds(1),
    reconcilerScheduleEnabled: false,
  });
  const work = new WorkTracker(() => 10);
  await simulate(stack, { timeScale: 0.05, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    // Three light ones fill the lock; the heavy one (all 3 permits) queues behind them.
    const first = [0, 1, 2].map((i) => sim.startExecution(sm, { weight: 1, i }));
    await until(() => work.inside === 3, 'the lock full');
    const heavy = sim.startExecution(sm, { weight: 3, i: 'heavy' });
    await until(() => heavy.history.some((h) => h.name === STATE.waitInQueue), 'the heavy one queued');
    // Then a steady stream of light ones, one every 2 s: with polling, each would take a permit as it came free.
    const later = [];
    for (let i = 0; i < 8; i++) {
      later.push(sim.startExecution(sm, { weight: 1, i: `later-${i}` }));
      await sim.sleep(2);
    }
    await Promise.all([...first, heavy, ...later].map((e) => e.done));
    expect([...first, heavy, ...later].every((e) => e.status === 'SUCCEEDED')).toBe(true);
    const heavyStart = work.startedAt.get(heavy.arn)!;
    // Every light one that arrived after it started after it.
    expect(later.map((e) => work.startedAt.get(e.arn)! > heavyStart)).toEqual(Array(later.length).fill(true));
    // It collected: woken with one permit, it took the other two once the first three were done.
    expect(heavy.history.some((h) => h.name === STATE.completePermits)).toBe(true);
    await sim.idle();
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});

test('a collector whose acquireTimeout passes fails with SemaphoreAcquireTimeout and takes its permit and its mark off the lock', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({
    permits: sfn.JsonPath.numberAt('$.weight'),
    concurrencyLimit: 3,
    acquireTimeout: Duration.seconds(60),
    pollInterval: Duration.seconds(1),
    reconcilerScheduleEnabled: false,
  });
  const work = new WorkTracker((input) => input.seconds);
  let lightInside = false;
  // The light one's body stays inside until the heavy one waits on its ticket (however slow the
  // machine), so that its release hands the heavy one a permit.
  const handler: typeof work.handler = async (input, context) => {
    if (input.untilQueued) {
      lightInside = true;
      const queued = async () => (await context.simulator.scan('WorkflowLockTable')).some((i) => isTicketKey(i.lockName.S!) && i[TICKET_WAITER] !== undefined);
      await until(queued, 'the heavy one to wait on its ticket');
    }
    return work.handler(input, context);
  };
  await simulate(stack, { timeScale: 0.05, lambdaHandlers: { [workFunctionId]: handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    // The hog holds 2 of 3 for longer than the heavy one will wait; a light one holds the third.
    const hog = sim.startExecution(sm, { weight: 2, seconds: 240 }, { name: 'hog' });
    await until(() => work.inside === 1, 'the hog inside');
    const light = sim.startExecution(sm, { weight: 1, seconds: 5, untilQueued: true }, { name: 'light' });
    await until(() => lightInside, 'the light one inside');
    // The heavy one queues, is handed the light one's permit, and collects: it needs the hog's.
    const heavy = sim.startExecution(sm, { weight: 2, seconds: 5 }, { name: 'heavy' });
    const failed = await heavy.done;
    expect([failed.status, failed.error]).toEqual(['FAILED', ConcurrencyControlledWorkflow.ACQUIRE_TIMEOUT_ERROR]);
    expect(heavy.history.some((h) => h.name === STATE.registerCollector)).toBe(true);
    expect(work.startedAt.has(heavy.arn)).toBe(false);
    // Its permit went back with its mark: a newcomer takes the free permit at once, beside the hog.
    const [lock] = (await sim.scan('WorkflowLockTable')).filter((i) => i.lockName.S === LOCK);
    expect([lock.permitsInUse.N, lock.collecting?.N ?? '0']).toEqual(['2', '0']);
    const late = await sim.startExecution(sm, { weight: 1, seconds: 1 }, { name: 'late' }).done;
    expect(late.status).toBe('SUCCEEDED');
    expect(late.history.some((h) => h.name === STATE.takeTicket)).toBe(false);
    expect(hog.status).toBe('RUNNING');
    await Promise.all([hog.done, light.done]);
    await sim.idle();
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});

test('a weighted waiter of the queue hands its body the fencing token it drew when it held all its permits, above every earlier one', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({
    permits: sfn.JsonPath.numberAt('$.weight'),
    concurrencyLimit: 2,
    waitStrategy: WaitStrategy.QUEUE,
    pollInterval: Duration.seconds(1),
    permitPath: '$.permit',
    reconcilerScheduleEnabled: false,
  });
  const bodies: Array<{ weight: number; token: number; start: number; end?: number }> = [];
  // Bodies of 30 s: a body that ended before another started did so long after that one's permits were granted.
  const work = new WorkTracker(() => 30);
  const handler: typeof work.handler = async (input, context) => {
    const body: (typeof bodies)[number] = { weight: input.weight, token: input.permit.fencingToken, start: context.simulator.now() };
    bodies.push(body);
    try {
      return await work.handler(input, context);
    } finally {
      body.end = context.simulator.now();
    }
  };
  await simulate(stack, { timeScale: 0.05, lambdaHandlers: { [workFunctionId]: handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const executions = [1, 2, 1, 2].map((weight, i) => sim.startExecution(sm, { weight, i }));
    await Promise.all(executions.map((e) => e.done));
    expect(executions.map((e) => e.status)).toEqual(Array(4).fill('SUCCEEDED'));
    expect(executions.some((e) => e.history.some((h) => h.name === STATE.completePermits))).toBe(true);
    // Every body got its own token, and each is above those of every body that ended before it started
    // (a collector draws its token when it completes, not when it was handed its first permit).
    expect(bodies.map((b) => typeof b.token)).toEqual(Array(4).fill('number'));
    expect(new Set(bodies.map((b) => b.token)).size).toBe(4);
    for (const b of bodies) {
      for (const earlier of bodies.filter((e) => e.end! <= b.start)) expect(b.token).toBeGreaterThan(earlier.token);
    }
  });
});
