import { Duration } from 'aws-cdk-lib';
import { mostInAnyWindow, TaskError } from '../simulator';
import { IdempotencyKey, RateLimit } from '../src';
import { lockItem, lockState, simulate, stateMachineLogicalId, until, WorkTracker, workflowStack } from './helpers';
import { TRANSIENT_RETRIES } from '../src/private/dynamodb-errors';
import { HOLDER_REDRIVE_COUNT } from '../src/private/lock-schema';
import { RELEASE_AT_INTERVAL_FAILED, RELEASE_AT_INTERVAL_SUFFIX, STATE } from '../src/private/state-names';

/*
 * The rate limit's failures and redrives: every path that frees a permit holds it for at least the
 * interval (split from rate-limit.test.ts so that Jest's workers share the time evenly).
 */

const LOCK = 'TestStack/Workflow';

test('failing and stopped bodies: the catch and the cleanup free the permit only once the interval has passed', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({ rateLimit: RateLimit.of(2, Duration.seconds(20)), reconcilerScheduleEnabled: false });
  const work = new WorkTracker(() => 1);
  await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const inputs = Array.from({ length: 10 }, (_, i) => ({ i, fail: i % 3 === 0, abortInside: i % 3 === 1 }));
    const executions = inputs.map((input) => sim.startExecution(sm, input));
    await Promise.all(executions.map((e) => e.done));
    await sim.idle();

    expect(executions.map((e) => e.status)).toEqual(inputs.map((i) => (i.fail ? 'FAILED' : i.abortInside ? 'ABORTED' : 'SUCCEEDED')));
    expect(work.starts).toHaveLength(10);
    expect(mostInAnyWindow(work.starts, 20_000)).toBe(2);
    // Each failed execution waited out the interval before it gave its permit back.
    for (const e of executions.filter((x) => x.status === 'FAILED')) {
      expect(e.stateTransitions.get(STATE.holdAfterFailure)).toBe(1);
      expect(e.stopDate! - work.startedAt.get(e.arn)!).toBeGreaterThanOrEqual(20_000);
    }
    // Every cleanup (of the failed ones too, which gave their permit back themselves) waited the
    // interval before it looked; those of the stopped ones then freed the permit.
    const cleanups = sim.executionsOf(sim.stateMachine(stateMachineLogicalId(workflow.cleanupStateMachine)));
    expect(cleanups).toHaveLength(inputs.filter((i) => i.fail || i.abortInside).length);
    expect(cleanups.every((c) => c.stateTransitions.get('Hold Permit For Rate Interval') === 1 && c.stopDate! - c.startDate >= 20_000)).toBe(true);
    expect(cleanups.filter((c) => c.stateTransitions.has('Release Permit Of Stopped Execution') && !c.stateTransitions.has('Permit Not Held'))).toHaveLength(
      inputs.filter((i) => i.abortInside).length,
    );
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});

test.each([
  ['after its Wait branch gave the permit back', 90],
  ['inside the interval, before its Wait branch gave the permit back', 30],
])('a run stopped %s and redriven holds a permit a whole interval after its body starts again', async (_, stopAt) => {
  // X works 180 s on its first run and is stopped at `stopAt` (its 60 s Wait branch gives the permit
  // back at 60 s, while the body runs on), and redriven 2 s later: the redrive guard takes a permit for
  // the new run, or claims X's entry while its cleanup still waits out the interval. X's body starts
  // again (RedriveExecution reruns the unsuccessful branches: the Wait too, if it had not ended, whose
  // release then reads the stopped run's stamp and leaves the new run's permit alone). Y, started
  // then, must not start within 60 s of X's second start. (The interval leaves the guard a minute of
  // simulated time, 6 s of real time, to act before anything it races with.)
  const { stack, workflow, workFunctionId } = workflowStack({ rateLimit: RateLimit.of(1, Duration.seconds(60)), reconcilerScheduleEnabled: false });
  const work = new WorkTracker((input, run) => (input.x && run === 1 ? 180 : 1));
  // A millisecond of CPU is 10 ms of simulated time: the guard and the cleanup keep their order under load.
  await simulate(stack, { timeScale: 0.1, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const x = sim.startExecution(sm, { x: true }, { name: 'x' });
    await sim.sleep(stopAt);
    // After the interval: once the Wait branch's release has ended (waited for, not timed: a busy machine
    // stretches the simulated seconds its call takes).
    const releasedBeside = `${STATE.release}${RELEASE_AT_INTERVAL_SUFFIX}`;
    if (stopAt >= 60) await until(() => x.history.some((h) => h.type.endsWith('StateExited') && h.state === releasedBeside), "X's Wait branch to end");
    x.abort();
    await x.done;
    expect(x.stateTransitions.get(STATE.rateIntervalReleased)).toBeUndefined();
    await sim.sleep(2);
    const redriven = sim.redriveExecution(x.arn);
    await until(() => work.starts.length === 2, "X's body to start again");
    // The guard (run by the redrive's status event) has taken a permit for the new run, or claimed X's
    // entry for it, before Y starts: waited for, not timed, since a busy machine can delay it.
    const entryOfNewRun = async () => (await lockItem(sim))?.[x.holderId]?.M?.[HOLDER_REDRIVE_COUNT]?.N === '1';
    await until(entryOfNewRun, 'the redrive guard to take a permit for the new run');
    const y = sim.startExecution(sm, { y: true }, { name: 'y' });
    const [xAgain, yDone] = await Promise.all([redriven, y.done]);

    expect([xAgain.status, yDone.status]).toEqual(['SUCCEEDED', 'SUCCEEDED']);
    expect(work.byExecution.get(x.arn)).toBe(2);
    const xSecondStart = work.starts[1];
    expect(work.startedAt.get(yDone.arn)! - xSecondStart).toBeGreaterThanOrEqual(60_000);
    // Stopped inside its interval, X's entry was still held (its cleanup waits out the interval) and the
    // guard claimed it for the new run: X's two starts share one permit (the README says so), while
    // everyone else keeps the rate.
    expect(mostInAnyWindow(work.starts, 60_000)).toBe(stopAt >= 60 ? 1 : 2);
    expect(mostInAnyWindow(work.starts.slice(1), 60_000)).toBe(1);
    expect(xAgain.stateTransitions.get(STATE.holdAfterRedrive)).toBe(1);
    // The Wait branch ran again only if it had not ended, and its release left the new run's permit alone.
    expect(xAgain.stateTransitions.get(`${STATE.alreadyReleased}${RELEASE_AT_INTERVAL_SUFFIX}`)).toBe(stopAt >= 60 ? undefined : 1);
    await sim.idle();
    const [cleanup] = sim.executionsOf(sim.stateMachine(stateMachineLogicalId(workflow.cleanupStateMachine)));
    expect(cleanup.stateTransitions.has('Permit Not Held')).toBe(true);
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});

test.each([
  ['its first write', STATE.release, false],
  ['the hand-off, after it served the next ticket', STATE.handOff, false],
  ['its first write, idempotent', STATE.release, true],
])('a release beside the body that fails past its retries (%s) does not stop the body: the release after the body gives the permit back', async (_, failing, idempotent) => {
  // X's body runs 40 s; its permit should go back at 10 s, beside it, but that release's write is
  // throttled past its retries. Y queued behind X gets the permit once X's body has ended, and X succeeds.
  const { stack, workflow, workFunctionId } = workflowStack({
    rateLimit: RateLimit.of(1, Duration.seconds(10)),
    queueCheckInterval: Duration.seconds(60),
    reconcilerScheduleEnabled: false,
    ...(idempotent ? { idempotency: { key: IdempotencyKey.fromFields('$.name') } } : {}),
  });
  const work = new WorkTracker((input) => (input.name === 'x' ? 40 : 1));
  const failingState = `${failing}${RELEASE_AT_INTERVAL_SUFFIX}`;
  let failed = 0;
  await simulate(
    stack,
    {
      timeScale: 0.1,
      lambdaHandlers: { [workFunctionId]: work.handler },
      taskHandlers: {
        [failingState]: async (input, { simulator, execution }) => {
          if (execution.name === 'x') {
            failed++;
            throw new TaskError('DynamoDB.ProvisionedThroughputExceededException', 'The level of configured provisioned throughput for the table was exceeded');
          }
          return simulator.dynamo.run('arn:aws:states:::dynamodb:updateItem', input);
        },
      },
    },
    async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const x = sim.startExecution(sm, { name: 'x' }, { name: 'x' });
      await until(() => work.starts.length === 1, "X's body to start");
      const y = sim.startExecution(sm, { name: 'y' }, { name: 'y' });
      await Promise.all([x.done, y.done]);

      expect([x.status, y.status]).toEqual(['SUCCEEDED', 'SUCCEEDED']);
      // The first attempt and its retries (transientRetry).
      expect(failed).toBe(TRANSIENT_RETRIES + 1);
      // X's body ran once, to its end; the branch ended at the failure, and the release after the body gave the permit back.
      expect(work.byExecution.get(x.arn)).toBe(1);
      expect(x.stateTransitions.get(RELEASE_AT_INTERVAL_FAILED)).toBe(1);
      expect(x.stateTransitions.get(STATE.rateIntervalReleased)).toBeUndefined();
      expect(x.stateTransitions.get(idempotent ? STATE.prepareRelease : STATE.release)).toBe(1);
      expect(work.startedAt.get(y.arn)! - work.startedAt.get(x.arn)!).toBeGreaterThanOrEqual(40_000);
      await sim.idle();
      expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
    },
  );
});

test.each([false, true])('a rate alone (idempotent: %s): a body that fails after its permit went back fails at once; one that fails inside its interval holds the permit until the interval has passed', async (idempotent) => {
  // X fails at 90 s, after its branch gave the permit back at 60 s (to Y, queued); Y fails 5 s into its
  // body, inside its interval, so its permit stays held until the interval has passed and Z waits for it.
  const { stack, workflow, workFunctionId } = workflowStack({
    rateLimit: RateLimit.of(1, Duration.seconds(60)),
    reconcilerScheduleEnabled: false,
    ...(idempotent ? { idempotency: { key: IdempotencyKey.fromFields('$.name') } } : {}),
  });
  const work = new WorkTracker((input) => input.seconds);
  await simulate(stack, { timeScale: 0.1, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const x = sim.startExecution(sm, { name: 'x', seconds: 90, fail: true }, { name: 'x' });
    await until(() => work.starts.length === 1, "X's body to start");
    const y = sim.startExecution(sm, { name: 'y', seconds: 5, fail: true }, { name: 'y' });
    // Y queued before Z starts (waited for, not timed), so that the permit goes to Y first.
    await until(() => y.stateTransitions.has(STATE.waitInQueue), 'Y queued');
    const z = sim.startExecution(sm, { name: 'z', seconds: 1 }, { name: 'z' });
    await Promise.all([x.done, y.done, z.done]);

    expect([x.status, y.status, z.status]).toEqual(['FAILED', 'FAILED', 'SUCCEEDED']);
    expect([x.error, y.error]).toEqual(['WorkFailed', 'WorkFailed']);
    // With idempotency, the failure is recorded (a repeat may run again).
    if (idempotent) expect([x, y].every((e) => e.stateTransitions.get(STATE.markFailed) === 1)).toBe(true);
    // X: nothing held when its body failed, so no second interval (it would end at 150 s).
    expect(x.stateTransitions.get(STATE.checkPermitAfterFailure)).toBe(1);
    expect(x.stateTransitions.get(STATE.holdAfterFailure)).toBeUndefined();
    expect(x.stopDate! - work.startedAt.get(x.arn)!).toBeLessThan(120_000);
    // Y: the check found its permit, which it held for the interval after its failure.
    expect(y.stateTransitions.get(STATE.checkPermitAfterFailure)).toBe(1);
    expect(y.stateTransitions.get(STATE.holdAfterFailure)).toBe(1);
    expect(y.stopDate! - work.startedAt.get(y.arn)!).toBeGreaterThanOrEqual(60_000);
    expect(work.startedAt.get(y.arn)! - work.startedAt.get(x.arn)!).toBeGreaterThanOrEqual(60_000);
    expect(work.startedAt.get(z.arn)! - work.startedAt.get(y.arn)!).toBeGreaterThanOrEqual(60_000);
    expect(mostInAnyWindow(work.starts, 60_000)).toBe(1);
    await sim.idle();
    expect(await lockState(sim)).toEqual([{ lockName: LOCK, permitsInUse: 0, holders: [] }]);
  });
});

