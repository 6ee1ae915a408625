import { Duration } from 'aws-cdk-lib';
import { ApiError, Simulator, TaskContext, TaskError } from '../simulator';
import { WaitStrategy } from '../src';
import { cleanupsEnded, lockState, stateMachineLogicalId, until, WorkTracker, workflowStack } from './helpers';
import { HOLDER_REDRIVE_COUNT, isTicketKey, LOCK_KEY, TICKET_WAITER } from '../src/private/lock-schema';
import { STATE } from '../src/private/state-names';

/*
 * The races of issue 14, each at limit 1 with two executions, in the simulator: a holder entry that
 * stops meaning "this run of this execution may be in the body". Each test failed before its fix:
 * two executions ended up in the body at once, or one never got there while it held a permit.
 * The protocol checker (test/protocol-checker.test.ts) searches every interleaving of the same
 * protocol; these pin the reported cases on the real state machines and the reconciler's real code.
 */

const LOCK = 'TestStack/Workflow';
const TABLE = 'WorkflowLockTable';

/** Status-change events of redriven runs go nowhere: as if EventBridge lost them, so the redrive guard never runs. */
function loseRedriveEvents(sim: Simulator): void {
  const putEvent = sim.putEvent.bind(sim);
  sim.putEvent = (event) => {
    if (event.detail?.status === 'RUNNING') return;
    putEvent(event);
  };
}

/** The holder entry of an execution, as the lock item has it now. */
async function entryOf(sim: Simulator, holderId: string) {
  // The lock item, not one of its queue's ticket items.
  return (await sim.scan(TABLE)).find((item) => !isTicketKey(item[LOCK_KEY]?.S ?? ''))?.[holderId]?.M;
}

/** A work function that records the redrive count of its execution's entry when it starts. */
function recordingEntries(sim: () => Simulator, work: WorkTracker, entries: Map<string, string | undefined>) {
  return async (input: any, context: TaskContext) => {
    const entry = await entryOf(sim(), context.execution.holderId);
    entries.set(`${context.execution.name}#${context.execution.redriveCount}`, entry?.[HOLDER_REDRIVE_COUNT]?.N);
    return work.handler(input, context);
  };
}

/**
 * The stopped execution's cleanup has ended (finding nothing to free) and its late acquire has landed
 * after it: waited for, rather than slept for, so that a busy machine's pause cannot reorder them.
 */
async function lateAcquireAfterCleanup(sim: Simulator, sm: unknown, x: { arn: string }): Promise<void> {
  await until(async () => cleanupDone(sim, sm, x.arn) && (await lockState(sim))[0]?.holders.length === 1, 'the cleanup done, then the late acquire landed');
}

/** Whether a cleanup of execution `arn` (an execution of another state machine than `sm`) has ended. */
function cleanupDone(sim: Simulator, sm: unknown, arn: string): boolean {
  return [...sim.executions.values()].some((e) => e.stateMachine !== sm && e.status !== 'RUNNING' && JSON.stringify(e.input).includes(arn));
}

/**
 * The acquire of a stopped execution that lands late: at least 60 s after it was sent, and only once
 * the execution's cleanup has ended (its cleanup state machine's first run can start late on a busy
 * machine, when checking its definition takes long), so that the write lands after the cleanup looked.
 */
async function landAfterCleanup(simulator: Simulator, execution: { arn: string; stateMachine: unknown }): Promise<void> {
  await simulator.sleep(60);
  for (let i = 0; i < 3600 && !cleanupDone(simulator, execution.stateMachine, execution.arn); i++) await simulator.sleep(1);
}

test('F1: a run redriven before the body claims the entry its stopped run left, stamped with its own run; a late cleanup of that run leaves it', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 1, reconcilerScheduleEnabled: false });
  const work = new WorkTracker((input) => input.seconds);
  const entries = new Map<string, string | undefined>();
  let slow = true;
  const sim: Simulator = await Simulator.start(stack, {
    lambdaHandlers: { [workFunctionId]: recordingEntries(() => sim, work, entries) },
    taskHandlers: {
      // X's first acquire lands late: after X was stopped and its cleanup found nothing.
      [STATE.acquire]: async (input, { simulator, execution }) => {
        if (slow) await landAfterCleanup(simulator, execution);
        return simulator.dynamo.run('arn:aws:states:::dynamodb:updateItem', input);
      },
    },
  });
  try {
    loseRedriveEvents(sim);
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const x = sim.startExecution(sm, { seconds: 200 }, { name: 'x' });
    await until(() => x.stateTransitions.has(STATE.acquire), 'x acquiring');
    x.abort('Test.Stop', 'stopped while acquiring');
    await lateAcquireAfterCleanup(sim, sm, x);
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 1, holders: [x.arn] }]);
    const aborted = sim.events.find((e) => e.detail.executionArn === x.arn && e.detail.status === 'ABORTED')!;

    slow = false;
    void sim.redriveExecution(x.arn);
    // Waited for, not timed (a busy machine stretches the simulated seconds the states take).
    await until(() => work.byExecution.has(x.arn), "x's new run in the body");
    expect(work.byExecution.get(x.arn)).toBe(1); // in the body, on the permit its run 0 took
    // The ABORTED event of run 0, delivered again (EventBridge delivers at least once, in any order):
    // its second cleanup runs to its end.
    sim.putEvent(aborted);
    await cleanupsEnded(sim, x, 2);
    const y = sim.startExecution(sm, { seconds: 5 }, { name: 'y' });
    await sim.sleep(30);

    expect(entries.get('x#1')).toBe('1');
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 1, holders: [x.arn] }]);
    expect(work.byExecution.has(y.arn)).toBe(false);
    await sim.idle();
    expect(work.maxInside).toBe(1);
    expect([x.status, y.status]).toEqual(['SUCCEEDED', 'SUCCEEDED']);
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  } finally {
    await sim.stop();
  }
});

test('F2: a waiter redriven while queued waits under its new run; the permit handed to it carries that run, and a late cleanup of the old run leaves it', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({
    concurrencyLimit: 1,
    queueCheckInterval: Duration.seconds(60),
    reconcilerScheduleEnabled: false,
  });
  const work = new WorkTracker((input) => input.seconds);
  const entries = new Map<string, string | undefined>();
  const sim: Simulator = await Simulator.start(stack, { lambdaHandlers: { [workFunctionId]: recordingEntries(() => sim, work, entries) } });
  try {
    loseRedriveEvents(sim);
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const h = sim.startExecution(sm, { seconds: 40 }, { name: 'h' });
    await until(() => work.byExecution.has(h.arn), 'h in the body');
    const w = sim.startExecution(sm, { seconds: 200 }, { name: 'w' });
    // Until it sleeps in the queue (a few simulated seconds; more on a cold machine).
    await until(() => w.stateTransitions.has(STATE.waitInQueue), 'w in the queue');
    expect(w.stateTransitions.get(STATE.waitInQueue)).toBe(1);
    w.abort('Test.Stop', 'stopped while queued');
    await w.done;
    await cleanupsEnded(sim, w, 1);
    const aborted = sim.events.find((e) => e.detail.executionArn === w.arn && e.detail.status === 'ABORTED')!;

    void sim.redriveExecution(w.arn);
    // h releases at 40 s and hands its permit to w's run 1 (waited for, not timed).
    await until(() => work.byExecution.has(w.arn), "w's new run in the body");
    expect(work.byExecution.get(w.arn)).toBe(1);
    sim.putEvent(aborted);
    await cleanupsEnded(sim, w, 2);
    const y = sim.startExecution(sm, { seconds: 5 }, { name: 'y' });
    await sim.sleep(30);

    expect(entries.get('w#1')).toBe('1');
    expect(work.byExecution.has(y.arn)).toBe(false);
    await sim.idle();
    expect(work.maxInside).toBe(1);
    expect([h.status, w.status, y.status]).toEqual(['SUCCEEDED', 'SUCCEEDED', 'SUCCEEDED']);
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  } finally {
    await sim.stop();
  }
});

test('F3: a releaser redriven after its wake-up was delivered does not take back the permit the woken waiter uses', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 1, reconcilerScheduleEnabled: false });
  const work = new WorkTracker((input) => input.seconds);
  let stopAfterDelivery = true;
  let rInside = false;
  const sim: Simulator = await Simulator.start(stack, {
    lambdaHandlers: {
      // r's body stays inside until b waits on its ticket (however slow the machine), so that r's release wakes b.
      [workFunctionId]: async (input, context) => {
        if (input.untilQueued) {
          rInside = true;
          const queued = async () => (await context.simulator.scan(TABLE)).some((i) => isTicketKey(i.lockName.S!) && i[TICKET_WAITER] !== undefined);
          await until(queued, 'b to wait on its ticket');
        }
        return work.handler(input, context);
      },
    },
    taskHandlers: {
      // The wake-up reaches the waiter, then the releaser is stopped before its task completes.
      [STATE.wakeNextWaiter]: async (input, { simulator, execution, signal }) => {
        try {
          simulator.sendTaskSuccess(input.TaskToken, input.Output);
        } catch (e) {
          if (e instanceof ApiError) throw new TaskError(`Sfn.${e.name}Exception`, e.message);
          throw e;
        }
        if (stopAfterDelivery) {
          stopAfterDelivery = false;
          execution.abort('Test.Stop', 'stopped between the wake-up and its answer');
          await simulator.sleep(1e6, signal);
        }
        return {};
      },
    },
  });
  try {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const r = sim.startExecution(sm, { seconds: 10, untilQueued: true }, { name: 'r' });
    // Waits on states, not fixed times: a cold, busy machine runs the states slower against the compressed clock.
    await until(() => rInside, 'r in the body');
    const b = sim.startExecution(sm, { seconds: 200 }, { name: 'b' });
    await r.done;
    await until(() => work.byExecution.has(b.arn), 'b in the body');
    expect(r.status).toBe('ABORTED');
    expect(work.byExecution.get(b.arn)).toBe(1); // woken, in the body

    // Redriven at Wake Next Waiter: the call again hears that the token is closed.
    const redriven = sim.redriveExecution(r.arn);
    await sim.sleep(10);
    // Its new run has ended (waited for, not timed), whatever it did to the lock.
    await redriven;
    const n = sim.startExecution(sm, { seconds: 5 }, { name: 'n' });
    await sim.sleep(30);

    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 1, holders: [b.arn] }]);
    expect(work.byExecution.has(n.arn)).toBe(false);
    await sim.idle();
    expect(work.maxInside).toBe(1);
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  } finally {
    await sim.stop();
  }
});

test('F4: the redrive guard does not trust a history that does not show the redrive yet: it tries again and takes the permit', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 1 });
  // The redriven body (600 s) outlasts the guard's retry a minute later and its first load of the
  // reconciler's code, however slow the machine.
  const work = new WorkTracker((input, run) => (run === 1 ? input.seconds : 600));
  const sim = await Simulator.start(stack, { lambdaHandlers: { [workFunctionId]: work.handler } });
  try {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const x = await sim.startExecution(sm, { seconds: 10, abortInside: true }, { name: 'x' }).done;
    await sim.idle();
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
    // GetExecutionHistory is eventually consistent: the guard's first read does not show the redrive.
    const history = sim.getExecutionHistory.bind(sim);
    let stale = 1;
    sim.getExecutionHistory = (arn, reverse) => {
      const events = history(arn, reverse);
      if (arn !== x.arn || stale-- <= 0) return events;
      const ordered = reverse ? [...events].reverse() : events;
      const cut = ordered.map((e) => e.type).lastIndexOf('ExecutionRedriven');
      const before = ordered.slice(0, cut);
      return reverse ? before.reverse() : before;
    };

    void sim.redriveExecution(x.arn);
    // Lambda retries the failed invocation after a minute: waited for, not timed.
    await until(async () => (await lockState(sim))[0]?.holders.includes(x.arn) === true, 'the guard to take the permit for x');
    const y = sim.startExecution(sm, { seconds: 5 }, { name: 'y' });
    await sim.sleep(10);

    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 1, holders: [x.arn] }]);
    expect(work.byExecution.has(y.arn)).toBe(false);
    await sim.idle();
    expect(work.maxInside).toBe(1);
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  } finally {
    await sim.stop();
  }
});

test('F5: the sweep leaves the entry of an execution too young to be seen: a stale "does not exist" frees no live permit', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 1, reconcilerScheduleEnabled: false });
  const work = new WorkTracker((input) => input.seconds);
  const sim = await Simulator.start(stack, { lambdaHandlers: { [workFunctionId]: work.handler } });
  try {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const x = sim.startExecution(sm, { seconds: 100 }, { name: 'x' });
    await until(() => work.byExecution.has(x.arn), 'x in the body');
    expect(work.byExecution.get(x.arn)).toBe(1);
    // DescribeExecution is eventually consistent: an execution a moment old may not be found yet.
    const describe = sim.describeExecution.bind(sim);
    sim.describeExecution = (arn) => {
      if (arn === x.arn) throw new ApiError('ExecutionDoesNotExist', `Execution Does Not Exist: '${arn}'`);
      return describe(arn);
    };

    const result = (await sim.invokeFunction('WorkflowReconcilerFunction', {})) as any;

    expect(result.reclaimed).toEqual([]);
    sim.describeExecution = describe;
    const y = sim.startExecution(sm, { seconds: 5 }, { name: 'y' });
    await sim.sleep(10);
    expect(work.byExecution.has(y.arn)).toBe(false);
    await sim.idle();
    expect(work.maxInside).toBe(1);
  } finally {
    await sim.stop();
  }
});

test('F6: polling, a run redriven before the body finds the entry its stopped run left and enters with it, instead of polling forever', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({
    concurrencyLimit: 1,
    waitStrategy: WaitStrategy.POLLING,
    reconcilerScheduleEnabled: false,
  });
  const work = new WorkTracker((input) => input.seconds);
  let slow = true;
  const sim = await Simulator.start(stack, {
    lambdaHandlers: { [workFunctionId]: work.handler },
    taskHandlers: {
      [STATE.acquire]: async (input, { simulator, execution }) => {
        if (slow) await landAfterCleanup(simulator, execution);
        return simulator.dynamo.run('arn:aws:states:::dynamodb:updateItem', input);
      },
    },
  });
  try {
    loseRedriveEvents(sim);
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const x = sim.startExecution(sm, { seconds: 5 }, { name: 'x' });
    await until(() => x.stateTransitions.has(STATE.acquire), 'x acquiring');
    x.abort('Test.Stop', 'stopped while acquiring');
    await lateAcquireAfterCleanup(sim, sm, x);
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 1, holders: [x.arn] }]);

    slow = false;
    const again = sim.redriveExecution(x.arn);
    // Waited for, not timed (a busy machine stretches the simulated seconds the polls take); a run that
    // polled forever would never get there.
    await until(() => work.byExecution.has(x.arn), "x's new run in the body");

    // It got into the body on its own permit, and gave it back.
    expect(work.byExecution.get(x.arn)).toBe(1);
    expect((await again).status).toBe('SUCCEEDED');
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  } finally {
    await sim.stop();
  }
});
