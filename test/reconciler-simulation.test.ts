import { UpdateItemCommand } from '@aws-sdk/client-dynamodb';
import { CfnElement, Duration } from 'aws-cdk-lib';
import { GRACE_MS } from '../lambda/reconciler-flows';
import { Execution, LockMonitor, seededRandom, Simulator } from '../simulator';
import { WaitStrategy } from '../src';
import { cleanupsEnded, cleanupsOf, lockState, logicalId, queuedWaiters, stateMachineLogicalId, statuses, until, WorkTracker, workflowStack } from './helpers';
import { COLLECTING, ACQUIRE_CONDITION, ACQUIRE_UPDATE, CONCURRENCY_LIMIT, FENCING_TOKEN, HOLDER_ACQUIRED_AT, HOLDER_REDRIVE_COUNT, LOCK_KEY, NAMES, PERMITS_IN_USE, VALUES } from '../src/private/lock-schema';

/*
 * The reconciler, run from its bundled code in the simulator against the synthesized workflow: it
 * frees what lost events, failed cleanups and late acquires leave behind, and enforces leases.
 */

const RECONCILER = 'WorkflowReconcilerFunction';

async function sweep(sim: Simulator): Promise<any> {
  return sim.invokeFunction(RECONCILER, {});
}

test('with 60% of status events lost, one reconciler run leaves no permit held', async () => {
  // More permits than stops: however many events are lost, the leaks never block everyone (with no
  // schedule, nothing would free them before the sweep below).
  const limit = 16;
  const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: limit, reconcilerScheduleEnabled: false });
  const work = new WorkTracker(() => 5);
  // Which events are lost depends on the order of the simulator's random draws, which follows the
  // timing: at 60%, the 8 stops below lose none with a chance of 1 in 1,500 (at 30% it was 1 in 17).
  const sim = await Simulator.start(stack, { seed: 21, eventFaults: { lossRate: 0.6 }, lambdaHandlers: { [workFunctionId]: work.handler } });
  try {
    const random = seededRandom(21);
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const inputs = Array.from({ length: 40 }, (_, i) => ({ i, abortInside: random() < 0.3 }));
    expect(inputs.filter((input) => input.abortInside).length).toBe(8);
    const executions = inputs.map((input) => sim.startExecution(sm, input));
    await Promise.all(executions.map((e) => e.done));
    await sim.idle();
    const [before] = await lockState(sim);
    expect(sim.lostEvents).toBeGreaterThan(0);
    expect(before.permitsInUse).toBeGreaterThan(0); // the leak the reconciler is for
    expect(before.holders.every((h) => executions.find((e) => e.arn === h)!.status === 'ABORTED')).toBe(true);
    // Past the sweep's grace period (a younger entry's execution might not be visible yet).
    await sim.sleep(GRACE_MS / 1000);

    const result = await sweep(sim);

    expect(result.reclaimed.map((r: any) => r.executionArn).sort()).toEqual([...before.holders].sort());
    expect(result.reclaimed.every((r: any) => r.reason === 'execution ABORTED')).toBe(true);
    expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
  } finally {
    await sim.stop();
  }
});

test('DescribeExecution eventually consistent: a sweep that sees a stopped holder as RUNNING leaves it, and a later sweep frees it', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 2, reconcilerScheduleEnabled: false });
  const work = new WorkTracker((input) => input.seconds);
  // Every answer stale, up to 60 s back; every status event lost (only the sweep can free the permit).
  const options = { staleReads: { windowSeconds: 60, rate: 1 }, eventFaults: { lossRate: 1 }, lambdaHandlers: { [workFunctionId]: work.handler } };
  const sim = await Simulator.start(stack, options);
  try {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    // Holds its permit past the grace period, then is stopped.
    const holder = sim.startExecution(sm, { seconds: 10_000 });
    await until(() => work.byExecution.has(holder.arn), 'the holder in its body');
    await sim.sleep(GRACE_MS / 1000 + 5);
    holder.abort();
    await holder.done;
    expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 1, holders: [holder.arn] }]);

    // A moment after the stop, every answer the sweep gets is from before it: RUNNING, left alone.
    const early = await sweep(sim);
    expect(early.reclaimed).toEqual([]);
    expect(sim.staleAnswers).toBeGreaterThan(0);
    expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 1, holders: [holder.arn] }]);

    // Past the window, the answer is current: ABORTED, and the permit is freed.
    await sim.sleep(61);
    const later = await sweep(sim);
    expect(later.reclaimed.map((r: any) => [r.holder, r.executionArn, r.reason])).toEqual([[holder.holderId, holder.arn, 'execution ABORTED']]);
    expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
  } finally {
    await sim.stop();
  }
});

test('aborts during acquire (the late-acquire race) never leak after a reconciler run', async () => {
  // Everyone can get a permit, so every acquire the stop interrupts lands as a permit taken.
  const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 40, reconcilerScheduleEnabled: false });
  const work = new WorkTracker(() => 30);
  // Every DynamoDB call takes up to 3 s to land: a stop can come, and its cleanup run, in between.
  const sim = await Simulator.start(stack, { seed: 22, dynamoFaults: { maxLatencySeconds: 3 }, lambdaHandlers: { [workFunctionId]: work.handler } });
  try {
    const random = seededRandom(22);
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const executions = Array.from({ length: 40 }, (_, i) => sim.startExecution(sm, { i }, { abortAfterSeconds: random() * 3 }));
    await Promise.all(executions.map((e) => e.done));
    await sim.idle();
    const [before] = await lockState(sim);
    expect(statuses(executions)).toEqual({ ABORTED: 40 });
    // The cleanup looks three times (release, look for a waiter, release without one), so an acquire
    // rarely lands after all three; make sure one does: the write of a stopped execution, after its cleanup.
    const late = executions.find((e) => !before.holders.includes(e.arn))!;
    await sim.db.client.send(
      new UpdateItemCommand({
        TableName: sim.tableName('WorkflowLockTable'),
        Key: { [LOCK_KEY]: { S: 'TestStack/Workflow' } },
        UpdateExpression: ACQUIRE_UPDATE,
        ConditionExpression: ACQUIRE_CONDITION,
        ExpressionAttributeNames: {
          [NAMES.permits]: PERMITS_IN_USE,
          [NAMES.holder]: late.holderId,
          [NAMES.limit]: CONCURRENCY_LIMIT,
          [NAMES.fence]: FENCING_TOKEN,
          [NAMES.collecting]: COLLECTING,
        },
        ExpressionAttributeValues: {
          [VALUES.zero]: { N: '0' },
          [VALUES.one]: { N: '1' },
          [VALUES.limit]: { N: '40' },
          [VALUES.entry]: { M: { [HOLDER_ACQUIRED_AT]: { S: new Date(sim.now()).toISOString() }, [HOLDER_REDRIVE_COUNT]: { N: '0' } } },
        },
      }),
    );
    const [leaked] = await lockState(sim);
    expect(leaked.permitsInUse).toBe(before.permitsInUse + 1);
    await sim.sleep(GRACE_MS / 1000); // the sweep leaves an entry younger than its grace period

    await sweep(sim);

    expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
  } finally {
    await sim.stop();
  }
});

test('the queue: the sweep drops a waiter stopped while queued and hands the permit it freed to the oldest live waiter', async () => {
  // Waiters that never check on their own within the test: only a release or the sweep can wake them.
  const { stack, workflow, workFunctionId } = workflowStack({
    concurrencyLimit: 1,
    waitStrategy: WaitStrategy.QUEUE,
    queueCheckInterval: Duration.hours(1),
    reconcilerScheduleEnabled: false,
  });
  // Bodies long enough (3 s of real time at this time scale) that the woken waiter is still inside
  // when the test looks at the queue after the sweep, however long the sweep itself took.
  const work = new WorkTracker(() => 300);
  const sim = await Simulator.start(stack, { lambdaHandlers: { [workFunctionId]: work.handler } });
  try {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    // The permit is held by an execution that does not exist (as after a lost event): nobody will release it.
    const first = sim.startExecution(sm, {}, { name: 'first' });
    await first.done;
    const ghost = first.holderId.replace(/:first$/, ':ghost');
    await sim.db.client.send(
      new UpdateItemCommand({
        TableName: sim.tableName('WorkflowLockTable'),
        Key: { [LOCK_KEY]: { S: 'TestStack/Workflow' } },
        UpdateExpression: ACQUIRE_UPDATE,
        ConditionExpression: ACQUIRE_CONDITION,
        ExpressionAttributeNames: {
          [NAMES.permits]: PERMITS_IN_USE,
          [NAMES.holder]: ghost,
          [NAMES.limit]: CONCURRENCY_LIMIT,
          [NAMES.fence]: FENCING_TOKEN,
          [NAMES.collecting]: COLLECTING,
        },
        ExpressionAttributeValues: {
          [VALUES.zero]: { N: '0' },
          [VALUES.one]: { N: '1' },
          [VALUES.limit]: { N: '1' },
          [VALUES.entry]: { M: { [HOLDER_ACQUIRED_AT]: { S: new Date(sim.now()).toISOString() }, [HOLDER_REDRIVE_COUNT]: { N: '0' } } },
        },
      }),
    );
    const waiters: Execution[] = [];
    // One after the other: each queued before the next starts (waited for, not timed), so that their tickets are in this order.
    for (const name of ['a', 'b', 'c']) {
      const waiter = sim.startExecution(sm, {}, { name });
      waiters.push(waiter);
      await until(() => waiter.stateTransitions.get('Wait In Queue') === 1, `${name} queued`);
    }
    const [a, b, c] = waiters;
    await until(() => waiters.every((e) => e.stateTransitions.get('Wait In Queue') === 1), 'the three waiters queued');
    expect(waiters.every((e) => e.status === 'RUNNING' && e.stateTransitions.get('Wait In Queue') === 1)).toBe(true);
    b.abort('Test.Stop', 'stopped while queued');
    await b.done;
    await cleanupsEnded(sim, b, 1);
    const queued = async () => (await queuedWaiters(sim, 'TestStack/Workflow')).map(([waiter]) => waiter);
    expect(await queued()).toEqual([a.arn, b.arn, c.arn]); // its cleanup found nothing held; its ticket stays
    await sim.sleep(GRACE_MS / 1000); // the sweep leaves an entry younger than its grace period

    const result = await sweep(sim);

    const ghostArn = first.arn.replace(/:first$/, ':ghost');
    expect(result.reclaimed).toEqual([{ lockName: 'TestStack/Workflow', holder: ghost, executionArn: ghostArn, reason: 'execution DOES_NOT_EXIST' }]);
    expect([result.waitersRemoved, result.waitersAdmitted]).toEqual([1, 1]);
    expect(await queued()).toEqual([c.arn]);
    await Promise.all([a.done, c.done]);
    expect([a.status, b.status, c.status]).toEqual(['SUCCEEDED', 'ABORTED', 'SUCCEEDED']);
    // Woken by the sweep, then by a's release: in order, and nobody handed a permit to the stopped waiter.
    expect(work.startedAt.get(a.arn)!).toBeLessThan(work.startedAt.get(c.arn)!);
    expect([a, c].some((e) => e.stateTransitions.has('Take Back Permit'))).toBe(false);
    expect(work.byExecution.has(b.arn)).toBe(false);
    expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
  } finally {
    await sim.stop();
  }
});

test('duplicated and delayed events, with sweeps running alongside, never push the count below the holders', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 3, reconcileEvery: Duration.minutes(1) });
  const work = new WorkTracker(() => 20);
  const sim = await Simulator.start(stack, {
    seed: 23,
    eventFaults: { duplicateRate: 0.5, maxDelaySeconds: 90 },
    lambdaHandlers: { [workFunctionId]: work.handler },
  });
  try {
    const random = seededRandom(23);
    const monitor = new LockMonitor(sim, 'WorkflowLockTable', () => 3).start();
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const executions = Array.from({ length: 30 }, (_, i) => sim.startExecution(sm, { i, abortInside: random() < 0.3, fail: random() < 0.2 }));
    await Promise.all(executions.map((e) => e.done));
    await sim.idle();
    await sim.fireScheduledRules();
    await monitor.stop();

    expect(monitor.violations).toEqual([]);
    // The scheduled sweeps ran while executions acquired and released.
    expect(sim.lambdaInvocations.get(logicalId(workflow.reconciler.reconcilerFunction.node.defaultChild as CfnElement))).toBeGreaterThan(1);
    // Never more than the limit inside; that the lock was full shows in its permits, held through hand-offs.
    expect(work.maxInside).toBeLessThanOrEqual(3);
    expect(monitor.maxPermits).toBe(3);
    expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
  } finally {
    await sim.stop();
  }
});

test('an expired lease stops the execution before its permit is reused', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({
    concurrencyLimit: 1,
    leaseDuration: Duration.seconds(90),
    reconcileEvery: Duration.minutes(1),
  });
  const work = new WorkTracker((input) => input.seconds);
  const sim = await Simulator.start(stack, { lambdaHandlers: { [workFunctionId]: work.handler } });
  try {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const hog = sim.startExecution(sm, { seconds: 10_000 }, { name: 'hog' });
    await until(() => work.byExecution.has(hog.arn), 'the hog in its body');
    const next = sim.startExecution(sm, { seconds: 10 }, { name: 'next' });
    await Promise.all([hog.done, next.done]);

    expect([hog.status, hog.error]).toEqual(['ABORTED', 'SemaphoreLeaseExpired']);
    expect(hog.cause).toMatch(/for more than its lease of 90 s/);
    // The lease runs from the acquire (the entry's acquiredAt, which the cause names), not from the
    // body's start: on a busy machine the two can be seconds apart.
    const acquiredAt = Date.parse(/\(since ([^)]+)\)/.exec(hog.cause!)![1]);
    expect(acquiredAt).toBeLessThanOrEqual(work.startedAt.get(hog.arn)!);
    const heldFor = (hog.stopDate! - acquiredAt) / 1000;
    expect(heldFor).toBeGreaterThanOrEqual(90);
    expect(heldFor).toBeLessThan(90 + 60 + 10);
    expect(next.status).toBe('SUCCEEDED');
    // The permit went to the next execution only after the hog was stopped.
    expect(work.startedAt.get(next.arn)!).toBeGreaterThan(hog.stopDate!);
    expect(work.maxInside).toBe(1);
    await sim.idle();
    expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
  } finally {
    await sim.stop();
  }
});

describe('redrive guard', () => {
  test('a redriven execution resumes inside the body with a permit taken again for it', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 2 });
    // Redriven, the work runs long enough that the permit taken again shows while it runs, however slow
    // the machine (the guard's first call loads its code, and its calls take real time, which the
    // simulator multiplies).
    const work = new WorkTracker((input, run) => (run === 1 ? input.seconds : 300));
    const sim = await Simulator.start(stack, { lambdaHandlers: { [workFunctionId]: work.handler } });
    try {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const stopped = await sim.startExecution(sm, { seconds: 30, abortInside: true }, { name: 'stopped' }).done;
      await sim.idle();
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]); // freed by the cleanup

      const redriven = sim.redriveExecution(stopped.arn);
      // The redrive guard takes it (waited for, not timed: the guard runs on the redrive's status event).
      let taken = await lockState(sim);
      await until(async () => (taken = await lockState(sim))[0]?.permitsInUse !== 0, 'the permit taken again for the redriven run');
      expect(taken).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 1, holders: [stopped.arn] }]);
      // Redriven inside the body, the work runs again, holding its permit, and the permit comes back.
      const [again] = await Promise.all([redriven, sim.idle()]);

      expect(again.history.filter((h) => h.type === 'ExecutionRedriven')).toHaveLength(1);
      expect(work.byExecution.get(stopped.arn)).toBe(2);
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    } finally {
      await sim.stop();
    }
  });

  test('a status event of the run before the redrive, delivered again late, does not free the new run\'s permit', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 2 });
    // The redriven body (300 s) outlasts the guard, the event sent again and a whole cleanup, however slow the machine.
    const work = new WorkTracker((input, run) => (run === 1 ? input.seconds : 300));
    const sim = await Simulator.start(stack, { lambdaHandlers: { [workFunctionId]: work.handler } });
    try {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const stopped = await sim.startExecution(sm, { seconds: 60, abortInside: true }, { name: 'stopped' }).done;
      await sim.idle();
      const abortedEvent = sim.events.find((e) => e.detail.executionArn === stopped.arn && e.detail.status === 'ABORTED')!;
      expect(abortedEvent.detail.redriveCount).toBe(0);

      const redriven = sim.redriveExecution(stopped.arn);
      let taken = await lockState(sim);
      await until(async () => (taken = await lockState(sim))[0]?.permitsInUse !== 0, 'the permit taken again for the redriven run');
      expect(taken).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 1, holders: [stopped.arn] }]);
      // EventBridge delivers at least once: the old run's ABORTED event arrives again, now.
      sim.putEvent(abortedEvent);
      // Its cleanup runs (waited for, not timed: a loaded machine stretches the simulated seconds its
      // calls take), and leaves the permit of the redriven run alone.
      const cleanups = () => [...sim.executions.values()].filter((e) => e.stateMachine !== sm);
      await until(() => cleanups().length === 2, 'the second cleanup to start');
      await Promise.all(cleanups().map((e) => e.done));
      // The redriven run is still in its body.
      expect([stopped.status, work.byExecution.get(stopped.arn), work.inside]).toEqual(['RUNNING', 2, 1]);
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 1, holders: [stopped.arn] }]);
      expect(cleanups().map((e) => e.status)).toEqual(['SUCCEEDED', 'SUCCEEDED']);
      const [again] = await Promise.all([redriven, sim.idle()]);
      expect(again.status).toBe('SUCCEEDED');
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    } finally {
      await sim.stop();
    }
  });

  test('a redriven execution that finds every permit taken is stopped with SemaphoreRedriveRejected', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 1 });
    // Redriven, the work would take long: only the guard ends it.
    const work = new WorkTracker((input, run) => (run === 1 ? input.seconds : 600));
    const sim = await Simulator.start(stack, { lambdaHandlers: { [workFunctionId]: work.handler } });
    try {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      // Work long enough that the permit taken again on the redrive shows while it runs, however slow
      // the machine (the reconciler's calls take real time, which the simulator multiplies).
      const stopped = await sim.startExecution(sm, { seconds: 30, abortInside: true }, { name: 'stopped' }).done;
      await sim.idle();
      const holder = sim.startExecution(sm, { seconds: 300 }, { name: 'holder' });
      await until(() => work.byExecution.has(holder.arn), 'the holder in its body');

      const again = await sim.redriveExecution(stopped.arn);

      expect([again.status, again.error]).toEqual(['ABORTED', 'SemaphoreRedriveRejected']);
      expect(again.cause).toMatch(/Redriven at 'Do Work', inside the protected body, while every permit \(or body slot\) of lock 'TestStack\/Workflow' was taken/);
      // The resumed work state starts before the guard's event arrives: it runs without a permit for
      // that moment (see README, "Redrive"), and is stopped at once.
      const unguarded = (again.stopDate! - again.history.find((h) => h.type === 'ExecutionRedriven')!.timestamp) / 1000;
      // (The guard's first invocation loads its code: a loaded machine stretches it in simulated time.)
      expect(unguarded).toBeLessThan(120);
      expect((await holder.done).status).toBe('SUCCEEDED');
      await sim.idle();
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    } finally {
      await sim.stop();
    }
  });

  test('redriven at its acquire, an execution whose last acquire landed after its stop claims that entry for its new run', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 1, reconcilerScheduleEnabled: false });
    const work = new WorkTracker((input) => input.seconds);
    let slow = true;
    let lateWriteLanded = false;
    const sim = await Simulator.start(stack, {
      lambdaHandlers: { [workFunctionId]: work.handler },
      // The first acquire's write lands 60 s late: after its execution was stopped and cleaned up (its
      // cleanup's end waited for, not timed: on a busy machine the cleanup can start late).
      taskHandlers: {
        'Acquire Permit': async (input, { simulator, execution }) => {
          if (!slow) return simulator.dynamo.run('arn:aws:states:::dynamodb:updateItem', input);
          await simulator.sleep(60);
          await until(() => cleanupsOf(simulator, execution).some((e) => e.status !== 'RUNNING'), 'the cleanup of the stopped execution to end');
          try {
            return await simulator.dynamo.run('arn:aws:states:::dynamodb:updateItem', input);
          } finally {
            lateWriteLanded = true;
          }
        },
      },
    });
    try {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const execution = sim.startExecution(sm, { seconds: 5 }, { name: 'late' });
      await until(() => execution.stateTransitions.has('Acquire Permit'), 'the execution acquiring');
      execution.abort('Test.Stop', 'stopped while acquiring');
      // Waited for, not timed: on a loaded machine the write's real time stretches its simulated seconds.
      await until(() => lateWriteLanded, 'the late acquire to land');
      await sim.idle();
      expect(execution.status).toBe('ABORTED');
      // The leak: a permit held by a stopped execution, which no event will free.
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 1, holders: [execution.arn] }]);

      slow = false;
      const again = await sim.redriveExecution(execution.arn);
      await sim.idle();

      // Its acquire finds its own entry (not a full lock) and claims it: it neither waits beside it nor takes a second.
      expect(again.status).toBe('SUCCEEDED');
      expect(again.stateTransitions.get('Claim Own Permit')).toBe(1);
      expect(work.byExecution.get(execution.arn)).toBe(1);
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    } finally {
      await sim.stop();
    }
  });

  test('redriven while it waited in the queue: the new run queues on an entry of its own, and the permit it is handed carries its new run', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({
      concurrencyLimit: 1,
      waitStrategy: WaitStrategy.QUEUE,
      queueCheckInterval: Duration.seconds(60),
      reconcilerScheduleEnabled: false,
    });
    const work = new WorkTracker((input) => input.seconds);
    let entryInBody: any;
    const sim: Simulator = await Simulator.start(stack, {
      lambdaHandlers: {
        [workFunctionId]: async (input, context) => {
          if (input.name === 'waiter') entryInBody = (await sim.scan('WorkflowLockTable')).find((i) => i.lockName.S === 'TestStack/Workflow')![context.execution.holderId];
          return work.handler(input, context);
        },
      },
    });
    try {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const holder = sim.startExecution(sm, { seconds: 240 }, { name: 'holder' });
      await until(() => work.byExecution.has(holder.arn), 'the holder in its body');
      const waiter = sim.startExecution(sm, { seconds: 5, name: 'waiter' }, { name: 'waiter' });
      await until(() => waiter.stateTransitions.get('Wait In Queue') === 1, 'the waiter to queue');
      waiter.abort('Test.Stop', 'stopped while queued');
      await waiter.done;
      await cleanupsEnded(sim, waiter, 1);
      const queue = () => queuedWaiters(sim, 'TestStack/Workflow');
      expect(await queue()).toEqual([[waiter.arn, '0']]); // its cleanup found nothing held; the ticket stays

      const redriven = sim.redriveExecution(waiter.arn); // resolves when the new run ends
      // Redriven before the body, the guard leaves it to the workflow. The new run's wait on the stopped
      // run's ticket is refused (written by another run): it takes a ticket of its own, behind it.
      await until(async () => (await queue()).length === 2, 'the redriven run to take a ticket');
      expect(await queue()).toEqual([
        [waiter.arn, '0'],
        [waiter.arn, '1'],
      ]);
      expect(holder.status).toBe('RUNNING');
      const again = await redriven;
      await holder.done;
      expect([holder.status, again.status]).toEqual(['SUCCEEDED', 'SUCCEEDED']);
      // Handed over by the holder's release: the entry carries the run that waits for it now.
      expect(entryInBody.M[HOLDER_REDRIVE_COUNT]).toEqual({ N: '1' });
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    } finally {
      await sim.stop();
    }
  });

  test('a redrive outside the body is left to the workflow itself', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 1, acquireTimeout: Duration.seconds(20) });
    const work = new WorkTracker((input) => input.seconds);
    const sim = await Simulator.start(stack, { lambdaHandlers: { [workFunctionId]: work.handler } });
    try {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const holder = sim.startExecution(sm, { seconds: 60 }, { name: 'holder' });
      await until(() => work.byExecution.has(holder.arn), 'the holder in its body');
      const timedOut = await sim.startExecution(sm, { seconds: 1 }, { name: 'late' }).done;
      expect(timedOut.error).toBe('SemaphoreAcquireTimeout');
      await holder.done;

      // Redriven at its final Fail state: it fails again, with the same error, and takes nothing.
      const again = await sim.redriveExecution(timedOut.arn);
      await sim.idle();

      expect([again.status, again.error]).toEqual(['FAILED', 'SemaphoreAcquireTimeout']);
      expect(work.byExecution.has(timedOut.arn)).toBe(false);
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    } finally {
      await sim.stop();
    }
  });
});
