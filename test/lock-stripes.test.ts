import { App, Duration, Stack } from 'aws-cdk-lib';
import { Annotations, Match, Template } from 'aws-cdk-lib/assertions';
import { JsonPath, Pass } from 'aws-cdk-lib/aws-stepfunctions';
import { Construct } from 'constructs';
import { demoSubject } from '../demo/run';
import { brokenInvariants, Execution, runScenario, ScenarioOptions, Simulator } from '../simulator';
import { FAULT_MIXES, FAULT_SUITE_BASE } from './fault-mixes';
import { lockState, simulate, stateMachineLogicalId, until, WorkTracker, workflowStack } from './helpers';
import {
  ConcurrencyControlledWorkflow,
  ConcurrencyControlledWorkflowProps,
  IdempotencyKey,
  RateLimit,
  SemaphoreReconciler,
  SemaphoreReconcilerProps,
  SemaphoreTable,
  WaitStrategy,
} from '../src';

/*
 * A lock split into stripes (`lockStripes`): each execution draws one of `<lockName>#0` to `#<k-1>`
 * when it starts and takes its permit there. Every path runs in the simulator: the workflow with both
 * wait strategies, the cleanup (which reads every stripe), the redrive guard (which reads the stripe
 * from the history) and the fault suite's mixes, with each stripe held to its own share of the limit.
 */

const LOCK = 'TestStack/Workflow';
const BODY_STATES = new Set(['Do Work']);

function overhead(e: Execution): number {
  return [...e.stateTransitions].filter(([name]) => !BODY_STATES.has(name)).reduce((sum, [, n]) => sum + n, 0);
}

/** Each stripe's holders, by stripe name (stripes never written are left out). */
async function holdersByStripe(sim: Simulator): Promise<Record<string, string[]>> {
  return Object.fromEntries((await lockState(sim)).map((lock) => [lock.lockName, lock.holders]));
}

describe('the workflow', () => {
  test('uncontended: one transition more than one lock (the draw), 2 DynamoDB calls, the input and output as they were', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 6, lockStripes: 3 });
    const work = new WorkTracker();
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const drawn = new Set<string>();
      for (let run = 0; run < 12; run++) {
        const e = await sim.startExecution(sm, { order: run }).done;
        expect(e.status).toBe('SUCCEEDED');
        // The body got the input as it came, and its output is the execution's.
        expect(e.output).toEqual({ worked: true, echo: { order: run } });
        expect(overhead(e)).toBe(4);
        expect(e.stateTransitions.get('Pick Lock Stripe')).toBe(1);
        expect(e.dynamoCalls).toBe(2);
        for (const lock of await lockState(sim)) drawn.add(lock.lockName);
      }
      // Draws land on every stripe, and only on the stripes.
      expect([...drawn].sort()).toEqual([`${LOCK}#0`, `${LOCK}#1`, `${LOCK}#2`]);
      for (const lock of await lockState(sim)) expect(lock).toMatchObject({ permitsInUse: 0, holders: [] });
    });
  });

  test.each([WaitStrategy.QUEUE, WaitStrategy.POLLING])('%s: each stripe admits its share, the failures keep their error, nothing is left held', async (waitStrategy) => {
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 4, lockStripes: 2, waitStrategy });
    const work = new WorkTracker(() => 20);
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      let mostPerStripe = 0;
      let sampling = true;
      const sampler = (async () => {
        while (sampling) {
          for (const holders of Object.values(await holdersByStripe(sim))) mostPerStripe = Math.max(mostPerStripe, holders.length);
          await sim.sleep(1);
        }
      })();
      const executions = await Promise.all(Array.from({ length: 16 }, (_, i) => sim.startExecution(sm, { i, fail: i % 5 === 0 }).done));
      sampling = false;
      await sampler;

      for (const e of executions) {
        const failing = (e.input as { fail: boolean }).fail;
        expect([e.status, e.error]).toEqual(failing ? ['FAILED', 'WorkFailed'] : ['SUCCEEDED', undefined]);
        if (!failing) expect(e.output).toEqual({ worked: true, echo: e.input });
      }
      // At most a stripe's share (2) per stripe, so at most 4 inside; both stripes were full at once.
      expect(mostPerStripe).toBe(2);
      expect(work.maxInside).toBeGreaterThan(2);
      expect(work.maxInside).toBeLessThanOrEqual(4);
      // Some waited (16 for 4 permits) and went in on their stripe once a permit came back.
      expect(executions.filter((e) => e.stateTransitions.has('Wait For Permit')).length).toBeGreaterThan(0);
      await sim.idle();
      expect(Object.keys(await holdersByStripe(sim)).sort()).toEqual([`${LOCK}#0`, `${LOCK}#1`]);
      for (const lock of await lockState(sim)) expect(lock).toMatchObject({ permitsInUse: 0, holders: [] });
    });
  });
});

test('the acquire timeout: a waiter on a busy stripe gives up with SemaphoreAcquireTimeout, its error intact', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 2, lockStripes: 2, acquireTimeout: Duration.seconds(30) });
  const work = new WorkTracker((input) => input.seconds);
  await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    // Six at once on two stripes of one, each body 100 s: at least two wait on a stripe for longer than 30 s.
    const executions = await Promise.all(Array.from({ length: 6 }, () => sim.startExecution(sm, { seconds: 100 }).done));
    const timedOut = executions.filter((e) => e.status === 'FAILED');
    expect(timedOut.length).toBeGreaterThanOrEqual(2);
    for (const e of timedOut) expect([e.error, e.cause]).toEqual(['SemaphoreAcquireTimeout', 'No permit became free within the acquire timeout of 30 seconds']);
    expect(executions.filter((e) => e.status === 'SUCCEEDED').length).toBe(6 - timedOut.length);
    expect(work.maxInside).toBeLessThanOrEqual(2);
    await sim.idle();
    for (const lock of await lockState(sim)) expect(lock).toMatchObject({ permitsInUse: 0, holders: [] });
  });
});

test('payload edges: the input shares the state data with the stripe until the body; an input that leaves no room fails at the draw, holding nothing', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 2, lockStripes: 2 });
  const work = new WorkTracker();
  await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    const inputOf = (bytes: number) => ({ pad: 'x'.repeat(bytes - 10) });
    const fits = await sim.startExecution(sm, inputOf(255 * 1024)).done;
    expect(fits.status).toBe('SUCCEEDED');
    expect(fits.output).toEqual({ worked: true, echo: inputOf(255 * 1024) });
    // Within the quota as an input; over it with the stripe's name beside it.
    const tooLarge = await sim.startExecution(sm, inputOf(256 * 1024 - 20)).done;
    expect([tooLarge.status, tooLarge.error]).toEqual(['FAILED', 'States.DataLimitExceeded']);
    expect([...tooLarge.stateTransitions.keys()]).toEqual(['Pick Lock Stripe']);
    await sim.idle();
    for (const lock of await lockState(sim)) expect(lock).toMatchObject({ permitsInUse: 0, holders: [] });
  });
});

test('a body that fails on an input near the quota fails with its own error: the error takes the input\'s place', async () => {
  const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 2, lockStripes: 2 });
  const work = new WorkTracker();
  await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
    const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
    // The input, the stripe and the error (about 130 bytes) would not fit together; the input and the stripe do.
    const e = await sim.startExecution(sm, { fail: true, pad: 'x'.repeat(256 * 1024 - 110) }).done;
    expect([e.status, e.error]).toEqual(['FAILED', 'WorkFailed']);
    expect(JSON.parse(e.cause!).errorMessage).toBe(`work failed for ${e.name}`);
    await sim.idle();
    for (const lock of await lockState(sim)) expect(lock).toMatchObject({ permitsInUse: 0, holders: [] });
  });
});

describe('the cleanup and the redrive guard', () => {
  test('a stop inside the body: the cleanup reads every stripe, frees the one that holds it, and the waiter on it gets the permit', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 2, lockStripes: 2, reconcilerScheduleEnabled: false });
    const work = new WorkTracker((input) => input.seconds);
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const cleanup = sim.stateMachine(stateMachineLogicalId(workflow.cleanupStateMachine));
      // Four executions on two stripes of one: each stripe fills, the others wait on theirs.
      const stopped = sim.startExecution(sm, { seconds: 30, abortInside: true }, { name: 'stopped' });
      await until(() => work.byExecution.has(stopped.arn), 'the first execution in its body');
      const stripe = Object.entries(await holdersByStripe(sim)).find(([, holders]) => holders.includes(stopped.arn))![0];
      const others = Array.from({ length: 3 }, (_, i) => sim.startExecution(sm, { seconds: 10 }, { name: `other-${i}` }));
      const done = await Promise.all([stopped.done, ...others.map((e) => e.done)]);
      expect(done.map((e) => e.status)).toEqual(['ABORTED', 'SUCCEEDED', 'SUCCEEDED', 'SUCCEEDED']);
      await sim.idle();

      const cleanups = [...sim.executions.values()].filter((e) => e.stateMachine === cleanup);
      expect(cleanups.map((e) => e.status)).toEqual(['SUCCEEDED']);
      // Each stripe read; only the stripe that held it released (the other wrote nothing).
      expect(cleanups[0].stateTransitions.get('Read Stripe Of Stopped Execution')).toBe(2);
      expect(cleanups[0].stateTransitions.get('Release Permit Of Stopped Execution')).toBe(1);
      expect(cleanups[0].stateTransitions.get('Permit Not Held')).toBe(1);
      expect(stripe).toMatch(new RegExp(`^${LOCK}#[01]$`));
      expect(work.maxInside).toBeLessThanOrEqual(2);
      for (const lock of await lockState(sim)) expect(lock).toMatchObject({ permitsInUse: 0, holders: [] });
    });
  });

  test('a lock name from the input: the cleanup reads it from the stopped execution\'s input, then its stripes', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({
      lockName: JsonPath.stringAt('$.tenant'),
      concurrencyLimit: 2,
      lockStripes: 2,
      reconcilerScheduleEnabled: false,
    });
    const work = new WorkTracker((input) => input.seconds);
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const stopped = await sim.startExecution(sm, { tenant: 'acme', seconds: 10, abortInside: true }).done;
      expect(stopped.status).toBe('ABORTED');
      await sim.idle();
      const locks = await lockState(sim);
      expect(locks.map((l) => l.lockName)).toEqual([expect.stringMatching(/^acme#[01]$/)]);
      expect(locks[0]).toMatchObject({ permitsInUse: 0, holders: [] });
      const cleanup = sim.stateMachine(stateMachineLogicalId(workflow.cleanupStateMachine));
      const [run] = [...sim.executions.values()].filter((e) => e.stateMachine === cleanup);
      expect(run.stateTransitions.get('Read Stripe Of Stopped Execution')).toBe(2);
      expect(run.stateTransitions.get('Release Permit Of Stopped Execution')).toBe(1);
    });
  });

  test('a body that failed gave its permit back: its cleanup reads every stripe and writes nothing', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 8, lockStripes: 4, reconcilerScheduleEnabled: false });
    const work = new WorkTracker();
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const failed = await sim.startExecution(sm, { fail: true }).done;
      expect([failed.status, failed.error]).toEqual(['FAILED', 'WorkFailed']);
      await sim.idle();
      const cleanup = sim.stateMachine(stateMachineLogicalId(workflow.cleanupStateMachine));
      const [run] = [...sim.executions.values()].filter((e) => e.stateMachine === cleanup);
      expect(run.status).toBe('SUCCEEDED');
      expect(run.stateTransitions.get('Read Stripe Of Stopped Execution')).toBe(4);
      expect(run.stateTransitions.get('Permit Not Held')).toBe(4);
      expect(run.stateTransitions.has('Release Permit Of Stopped Execution')).toBe(false);
      expect([run.dynamoCalls, run.writeUnits]).toEqual([4, 0]);
    });
  });

  test('redriven inside the body: the guard takes the permit again on the stripe the execution drew', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ concurrencyLimit: 4, lockStripes: 4, reconcilerScheduleEnabled: false });
    const work = new WorkTracker((input, run) => (run === 1 ? input.seconds : 600));
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const x = await sim.startExecution(sm, { seconds: 10, abortInside: true }, { name: 'x' }).done;
      await sim.idle();
      const drawn = (await lockState(sim)).map((lock) => lock.lockName);
      // x's stripe is the only lock item written so far, freed by the cleanup.
      expect(drawn).toHaveLength(1);
      expect(await lockState(sim)).toEqual([{ lockName: drawn[0], permitsInUse: 0, holders: [] }]);

      void sim.redriveExecution(x.arn);
      await until(async () => (await holdersByStripe(sim))[drawn[0]]?.includes(x.arn) === true, 'the guard to take the permit for x');
      await until(() => work.byExecution.get(x.arn) === 2, 'x in its body again');
      // The permit is x's on its own stripe, and nowhere else.
      expect(await lockState(sim)).toEqual([{ lockName: drawn[0], permitsInUse: 1, holders: [x.arn] }]);
      const redriven = [...sim.executions.values()].find((e) => e.arn === x.arn)!;
      redriven.abort();
      await sim.idle();
      for (const lock of await lockState(sim)) expect(lock).toMatchObject({ permitsInUse: 0, holders: [] });
    });
  });
});

describe('with idempotency', () => {
  const props = { concurrencyLimit: 4, lockStripes: 2, idempotency: { key: IdempotencyKey.fromFields('$.id') } };

  test('a repeat returns the stored result; different inputs run on their stripes; a failure runs again and keeps its error', async () => {
    const { stack, workflow, workFunctionId } = workflowStack(props);
    const work = new WorkTracker(() => 5);
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const first = await sim.startExecution(sm, { id: 'a', n: 1 }).done;
      expect([first.status, first.output]).toEqual(['SUCCEEDED', { worked: true, echo: { id: 'a', n: 1 } }]);
      expect(first.stateTransitions.get('Pick Lock Stripe')).toBe(1);
      const repeat = await sim.startExecution(sm, { id: 'a', n: 2 }).done;
      expect([repeat.status, repeat.output]).toEqual(['SUCCEEDED', first.output]);
      // A repeat takes no permit: it does not draw.
      expect(repeat.stateTransitions.has('Pick Lock Stripe')).toBe(false);

      const others = await Promise.all(['b', 'c', 'd', 'e', 'f', 'g'].map((id) => sim.startExecution(sm, { id }).done));
      expect(others.map((e) => e.status)).toEqual(Array(6).fill('SUCCEEDED'));
      expect(work.maxInside).toBeLessThanOrEqual(4);

      const failed = await sim.startExecution(sm, { id: 'h', fail: true }).done;
      expect([failed.status, failed.error]).toEqual(['FAILED', 'WorkFailed']);
      const again = await sim.startExecution(sm, { id: 'h' }).done;
      expect(again.status).toBe('SUCCEEDED');
      expect(work.byExecution.get(again.arn)).toBe(1);
      await sim.idle();
      for (const lock of await lockState(sim)) expect(lock).toMatchObject({ permitsInUse: 0, holders: [] });
      expect((await lockState(sim)).map((l) => l.lockName).sort()).toEqual([`${LOCK}#0`, `${LOCK}#1`]);
    });
  });

  test('redriven inside the body: the guard reads the stripe from the draw that followed the idempotency\'s states', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ ...props, concurrencyLimit: 8, lockStripes: 4, reconcilerScheduleEnabled: false });
    const work = new WorkTracker((input, run) => (run === 1 ? input.seconds : 600));
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const x = await sim.startExecution(sm, { id: 'x', seconds: 10, abortInside: true }, { name: 'x' }).done;
      await sim.idle();
      const [stripe] = (await lockState(sim)).map((lock) => lock.lockName);
      expect(await lockState(sim)).toEqual([{ lockName: stripe, permitsInUse: 0, holders: [] }]);
      void sim.redriveExecution(x.arn);
      await until(async () => (await holdersByStripe(sim))[stripe]?.includes(x.arn) === true, 'the guard to take the permit for x');
      expect(await lockState(sim)).toEqual([{ lockName: stripe, permitsInUse: 1, holders: [x.arn] }]);
      [...sim.executions.values()].find((e) => e.arn === x.arn)!.abort();
      await sim.idle();
      for (const lock of await lockState(sim)) expect(lock).toMatchObject({ permitsInUse: 0, holders: [] });
    });
  });
});

describe('the fault suite on a split lock', () => {
  // The fault suite's run and mixes on 3 stripes of 2: 6 inside at most, 2 per lock item (the monitor's lockLimit).
  const BASE: ScenarioOptions = { ...FAULT_SUITE_BASE, limit: 6, lockLimit: 2 };
  const MIXES = FAULT_MIXES;
  const props = (waitStrategy: WaitStrategy): Partial<ConcurrencyControlledWorkflowProps> => ({
    concurrencyLimit: 6,
    lockStripes: 3,
    ...(waitStrategy === WaitStrategy.QUEUE ? { queueCheckInterval: Duration.seconds(60) } : { waitStrategy }),
  });

  describe.each(MIXES)('%s', (_name, mix) => {
    test.each([WaitStrategy.QUEUE, WaitStrategy.POLLING])('%s: every invariant holds on every stripe', async (waitStrategy) => {
      const result = await runScenario(demoSubject(6, props(waitStrategy)), { ...BASE, ...mix, seed: 11 });
      expect(brokenInvariants(result, 6)).toEqual([]);
      expect(result.succeeded + result.failed + result.aborted).toBe(BASE.executions);
      // More than one stripe's 2 were inside at once.
      expect(result.maxInside).toBeGreaterThan(2);
      if (mix.abortInsideRate && !mix.lostEventRate) expect(result.cleanupExecutions).toBeGreaterThan(0);
      if (mix.lostEventRate) {
        expect(result.lostEvents).toBeGreaterThan(0);
        expect(result.reclaimedByReconciler).toBeGreaterThan(0);
      }
      if (mix.lostWakeUpRate && waitStrategy === WaitStrategy.QUEUE) expect(result.lostWakeUps).toBeGreaterThan(0);
      if (mix.abortAcquiringRate) expect(result.aborted).toBeGreaterThan(0);
    });
  });

  test('the monitor holds each stripe to its share: told a stripe holds 1, it sees 2', async () => {
    const result = await runScenario(demoSubject(6, props(WaitStrategy.QUEUE)), { ...BASE, lockLimit: 1, executions: 18, seed: 11 });
    expect(result.invariantViolations).toContainEqual(expect.stringMatching(/#\d: 2 permits in use, limit 1$/));
  });
});

describe('synth', () => {
  test('the cleanup releases in a Map over the stripes; the guard knows the stripes; the dashboard sums them', () => {
    const { stack, workflow } = workflowStack({ concurrencyLimit: 500, lockStripes: 10, lockName: 'exports', dashboard: true });
    const template = Template.fromStack(stack);
    const cleanup = JSON.stringify(template.toJSON().Resources[stateMachineLogicalId(workflow.cleanupStateMachine)].Properties.DefinitionString);
    expect(cleanup).toContain('States.ArrayRange(0, 9, 1)');
    expect(cleanup).toContain('Release On Each Stripe');
    const workflowAsl = JSON.stringify(template.toJSON().Resources[stateMachineLogicalId(workflow.stateMachine)].Properties.DefinitionString);
    expect(workflowAsl).toContain("States.Format('{}#{}', 'exports', States.MathRandom(0, 10))");
    // Each stripe is a lock of 50.
    expect(workflowAsl).toContain('\\":limit\\":{\\"N\\":\\"50\\"}');
    template.hasResourceProperties('AWS::Lambda::Function', {
      Environment: { Variables: { LOCK_NAME: 'exports', LOCK_STRIPES: '10', CONCURRENCY_LIMIT: '50' } },
    });
    expect(workflow.lockStripes).toBe(10);
    // The warning of a high limit looks at a stripe's 50: none; at 5 stripes of 200 it warns of 200.
    Annotations.fromStack(stack).hasNoWarning('*', Match.stringLikeRegexp('with the queue'));
    const { stack: wider } = workflowStack({ concurrencyLimit: 1000, lockStripes: 5 });
    Annotations.fromStack(wider).hasWarning('*', Match.stringLikeRegexp('^concurrencyLimit 200 per stripe with the queue'));
    const dashboard = JSON.stringify(template.findResources('AWS::CloudWatch::Dashboard'));
    expect(dashboard).toContain('SUM([p0,p1,p2,p3,p4,p5,p6,p7,p8,p9])');
    expect(dashboard).toContain('exports#9');
  });

  test('a lock name from the input: each execution draws a stripe of its own lock', async () => {
    const { stack, workflow, workFunctionId } = workflowStack({ lockName: JsonPath.stringAt('$.tenant'), concurrencyLimit: 4, lockStripes: 2 });
    const work = new WorkTracker();
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineLogicalId(workflow.stateMachine));
      const executions = await Promise.all(['a', 'b', 'a', 'b', 'a', 'b'].map((tenant) => sim.startExecution(sm, { tenant }).done));
      expect(executions.map((e) => e.status)).toEqual(Array(6).fill('SUCCEEDED'));
      for (const lock of await lockState(sim)) {
        expect(lock.lockName).toMatch(/^[ab]#[01]$/);
        expect(lock).toMatchObject({ permitsInUse: 0, holders: [] });
      }
    });
  });

  test.each<[string, Partial<ConcurrencyControlledWorkflowProps>, RegExp]>([
    ['zero stripes', { lockStripes: 0, concurrencyLimit: 10 }, /`lockStripes` must be an integer from 1 to 100 .*got: 0/],
    ['a fraction', { lockStripes: 2.5, concurrencyLimit: 10 }, /`lockStripes` must be an integer from 1 to 100 .*got: 2.5/],
    ['too many', { lockStripes: 101, concurrencyLimit: 101 }, /`lockStripes` must be an integer from 1 to 100 .*got: 101/],
    ['no limit', { lockStripes: 2 }, /`concurrencyLimit` must be a number known at synth beside `lockStripes` \(2\), got: none/],
    ['a limit from the input', { lockStripes: 2, concurrencyLimit: JsonPath.numberAt('$.limit') }, /`concurrencyLimit` must be a number known at synth beside `lockStripes` \(2\), got: a token/],
    ['a fractional limit', { lockStripes: 2, concurrencyLimit: 10.5 }, /`concurrencyLimit` must be a positive integer, got: 10.5/],
    ['a limit it does not divide', { lockStripes: 7, concurrencyLimit: 500 }, /`concurrencyLimit` \(500\) must be a multiple of `lockStripes` \(7\).*for example 497 or 504/],
    ['a share above 1,000', { lockStripes: 2, concurrencyLimit: 2400 }, /`concurrencyLimit` \/ `lockStripes` must be at most 1000 .*got: 2400 \/ 2 = 1200/],
    ['weights', { lockStripes: 2, concurrencyLimit: 10, permits: 2 }, /`lockStripes` \(2\) cannot be combined with `permits` yet/],
    ['a rate', { lockStripes: 2, concurrencyLimit: 10, rateLimit: RateLimit.perSecond(5) }, /`lockStripes` \(2\) cannot be combined with `rateLimit` yet/],
    ['fencing tokens', { lockStripes: 2, concurrencyLimit: 10, permitPath: '$.permit' }, /`lockStripes` \(2\) cannot be combined with `permitPath` yet: each stripe draws fencing tokens of its own/],
    ['a name too long for the suffix', { lockStripes: 10, concurrencyLimit: 10, lockName: 'x'.repeat(254) }, /`lockName` must be at most 253 characters beside `lockStripes` \(10\)/],
  ])('refused: %s', (_name, props, message) => {
    expect(() => workflowStack(props)).toThrow(message);
  });

  test('the default lock name of a deeply nested workflow leaves room for the stripes\' suffix', () => {
    const stack = new Stack(new App(), 'TestStack');
    let scope: Construct = stack;
    for (let i = 0; i < 6; i++) scope = new Construct(scope, `Level${i}-${'n'.repeat(40)}`);
    const workflow = new ConcurrencyControlledWorkflow(scope, 'Workflow', { body: new Pass(stack, 'Work'), concurrencyLimit: 20, lockStripes: 10 });
    // Its path is longer than 255 characters: the default is a unique name of at most 253.
    expect(workflow.node.path.length).toBeGreaterThan(255);
    expect(workflow.lockName.length).toBeGreaterThan(200);
    expect(`${workflow.lockName}#9`.length).toBeLessThanOrEqual(255);
  });

  test.each<[string, Partial<SemaphoreReconcilerProps>, RegExp]>([
    ['zero stripes', { lockName: 'l', lockStripes: 0 }, /`lockStripes` must be an integer from 1 to 100, got: 0/],
    ['no lock', { lockStripes: 2 }, /`lockStripes` \(2\) is the split of `lockName`, for the redrive guard: set `lockName` too/],
    ['weights', { lockName: 'l', lockStripes: 2, permits: 2, concurrencyLimit: 4 }, /`lockStripes` \(2\) cannot be combined with `permits` yet/],
  ])('the reconciler refuses: %s', (_name, props, message) => {
    const stack = new Stack(new App(), 'S');
    expect(() => new SemaphoreReconciler(stack, 'R', { table: SemaphoreTable.fromTableName(stack, 'T', 't'), ...props })).toThrow(message);
  });

  test('one stripe is one lock: the definition is the same as without the prop', () => {
    const asl = (props: Partial<ConcurrencyControlledWorkflowProps>) => {
      const { stack, workflow } = workflowStack({ concurrencyLimit: 500, ...props });
      return JSON.stringify(Template.fromStack(stack).toJSON().Resources[stateMachineLogicalId(workflow.stateMachine)].Properties.DefinitionString);
    };
    expect(asl({ lockStripes: 1 })).toEqual(asl({}));
  });
});
