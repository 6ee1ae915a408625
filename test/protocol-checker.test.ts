import { AslMachine } from '../checker/asl';
import { configNamed } from '../checker/configs';
import { canonicalSequence, NO_FAULTS } from '../checker/model';
import { checkConfig, report } from '../checker/run';
import { System } from '../checker/system';
import {
  ACQUIRE_CONDITION,
  CLAIM_CONDITION,
  CLAIM_UPDATE,
  HAND_OFF_CONDITION,
  HAND_OFF_UPDATE,
  HOLDER_CLAIMED,
  HOLDER_COLLECTING,
  HOLDER_HANDOFF_ID,
  HOLDER_PERMITS,
  PEEK_UPDATE,
  RELEASE_CONDITION,
  RELEASE_IF_NO_WAITERS_CONDITION,
  RETAKE_PERMIT_IN_SLOT_UPDATE,
  CLIENT_COMPLETE_COLLECTOR_CONDITION,
  STAMPED_AT_MOST,
} from '../src/private/lock-schema';
import { RELEASE_AT_INTERVAL_FAILED, RELEASE_AT_INTERVAL_SUFFIX, STATE } from '../src/private/state-names';

/*
 * The protocol checker (checker/) searches every interleaving of bounded configurations of the
 * synthesized state machines, the reconciler's flows and the client, with the faults of each; the test
 * command's check-protocol step searches each to a bound, `npm run check-protocol` in full. Here the checker is shown planted versions of the
 * races it is for, and must find each, with a trace: a checker that cannot fail proves nothing.
 */

// A planted race is found in seconds; the configurations' searches run in the test command's
// check-protocol step (npm run check-protocol), two processes side by side.
jest.setTimeout(5 * 60 * 1000);

describe('the search itself', () => {
  test('a bounded search (the test command\'s) stops at its bound and passes, having checked every state up to its depth', () => {
    const config = configNamed('queue-stops');
    const result = checkConfig(config, { bound: 2_000 });
    console.log(report(config, result));
    expect(result).toMatchObject({ states: 2_000, bounded: true, incomplete: false, counterexample: undefined });
    expect(report(config, result)).toMatch(/^queue-stops: ok to its bound — 2,000 states, .*every interleaving of up to \d+ steps/);
    // A planted race shallower than the bound is still found (F1/F2 below, in 318 states).
    const planted = checkConfig(config, { bound: 2_000, mutate: unstampedClaim });
    expect(planted.bounded).toBe(false);
    expect(planted.counterexample).toBeDefined();
  });

  test('tokens and UUIDs are keyed by their rank among those a world names, per execution: only freshness and equality matter', () => {
    expect(canonicalSequence('tok:A:0:7 uuid:A:0:9 tok:B:1:3 uuid:A:1:7 tok:A:0:stopped uuid:guard-A-1:4')).toBe(
      'tok:A:0:1 uuid:A:0:2 tok:B:1:1 uuid:A:1:1 tok:A:0:stopped uuid:guard-A-1:4',
    );
    // Two worlds that differ only in how many UUIDs an execution drew before share a key.
    expect(canonicalSequence('"handoffId":"uuid:B:0:92"')).toBe(canonicalSequence('"handoffId":"uuid:B:0:99"'));
  });
});

/** The system with every Task state of the workflow changed by `change` (a copy of the definition). */
function mutateWorkflow(change: (state: any, name: string) => void): (system: System) => System {
  return (system) => {
    const definition = JSON.parse(JSON.stringify(system.workflow.machine.definition));
    const visit = (scope: any) => {
      for (const [name, state] of Object.entries<any>(scope.States)) {
        if (state.Type === 'Task') change(state, name);
        for (const branch of state.Branches ?? []) visit(branch);
      }
    };
    visit(definition);
    return { ...system, workflow: { ...system.workflow, machine: new AslMachine(definition) } };
  };
}

/** F1/F2 planted back: a claim that does not stamp its run (found in 318 states of queue-stops). */
const unstampedClaim = mutateWorkflow((state) => {
  const p = state.Parameters;
  if (p?.UpdateExpression !== CLAIM_UPDATE) return;
  p.ConditionExpression = RELEASE_CONDITION;
  p.UpdateExpression = `SET #fence = if_not_exists(#fence, :zero) + :one, #holder.${HOLDER_CLAIMED} = :claimed`;
  delete p.ExpressionAttributeValues[':acquiredAt'];
  delete p.ExpressionAttributeValues[':redriveCount.$'];
  delete p.ExpressionAttributeValues[':acquiredAt.$'];
  delete p.ExpressionAttributeValues[':redriveCount'];
});

describe('the checker finds the races of issues 14 and 15 when they are planted back', () => {
  test('F1/F2: a claim that does not stamp its run lets a late cleanup of the stopped run free a permit in use', () => {
    const result = checkConfig(configNamed('queue-stops'), { mutate: unstampedClaim });
    console.log(report(configNamed('queue-stops'), result));
    expect(result.counterexample?.violation).toMatch(/OwnEntry: [AB] is in the body \(run 1\) without an entry stamped with its run/);
    expect(result.counterexample!.trace.length).toBeGreaterThan(2);
  });

  test('F3: a releaser redriven after its wake-up takes back the permit the woken waiter uses, without the run in the hand-off id', () => {
    const result = checkConfig(configNamed('queue-stops'), {
      mutate: mutateWorkflow((state) => {
        const values = state.Parameters?.ExpressionAttributeValues;
        const id = values?.[':handoffId']?.['S.$'];
        if (typeof id === 'string') values[':handoffId']['S.$'] = id.replace('$$.Execution.RedriveCount', "'0'");
        const entry = values?.[':entry']?.M?.[HOLDER_HANDOFF_ID]?.['S.$'];
        if (typeof entry === 'string') values[':entry'].M[HOLDER_HANDOFF_ID]['S.$'] = entry.replace('$$.Execution.RedriveCount', "'0'");
      }),
    });
    console.log(report(configNamed('queue-stops'), result));
    expect(result.counterexample?.violation).toMatch(/OwnEntry|inside at once/);
    expect(result.counterexample!.trace.some((s) => /redriven/.test(s.label))).toBe(true);
  });

  test('a rate alone: a release beside the body that does not check its run frees the permit the redrive guard took for the new run', () => {
    // The branch beside the body, run again by a redrive, carries the stopped run's count: only the
    // stamp keeps its release off the permit of the body that just started again.
    const config = configNamed('rate-alone-redrive');
    const result = checkConfig(config, {
      mutate: mutateWorkflow((state, name) => {
        const p = state.Parameters;
        if (!name.endsWith(RELEASE_AT_INTERVAL_SUFFIX) || p?.ConditionExpression !== RELEASE_IF_NO_WAITERS_CONDITION) return;
        p.ConditionExpression = p.ConditionExpression.replace(STAMPED_AT_MOST, 'attribute_exists(#holder)');
        delete p.ExpressionAttributeValues[':redriveCount.$'];
        delete p.ExpressionAttributeValues[':redriveCount'];
      }),
    });
    console.log(report(config, result));
    expect(result.counterexample?.violation).toMatch(/OwnEntry: A is in the body \(run 1\) without an entry stamped with its run/);
    expect(result.counterexample!.trace.some((s) => /redriven/.test(s.label))).toBe(true);
  });

  test('a rate alone: a release beside the body whose failed calls are not caught stops the body and fails the execution', () => {
    // A call throttled past its retries in that release must end its branch, not the Parallel.
    const config = configNamed('rate-alone-failures');
    const result = checkConfig(config, {
      mutate: mutateWorkflow((state, name) => {
        if (name.endsWith(RELEASE_AT_INTERVAL_SUFFIX)) state.Catch = (state.Catch ?? []).filter((c: any) => c.Next !== RELEASE_AT_INTERVAL_FAILED);
      }),
    });
    console.log(report(config, result));
    expect(result.counterexample?.violation).toMatch(/failed: its release beside the body, throttled past its retries in '.* At Rate Interval', stopped the body/);
    expect(result.counterexample!.trace.some((s) => /is throttled past its retries/.test(s.label))).toBe(true);
  });

  test('a rate alone: a check after a failed body that gives the permit back leaves the rest of the interval unheld', () => {
    // A body that failed before its branch released owes its permit the interval: the check must not free it.
    const config = configNamed('rate-alone-failures');
    const result = checkConfig(config, {
      mutate: mutateWorkflow((state, name) => {
        if (name !== STATE.checkPermitAfterFailure) return;
        state.Parameters.UpdateExpression = 'SET #permits = #permits - :one REMOVE #holder';
        state.Parameters.ExpressionAttributeValues[':one'] = { N: '1' };
      }),
    });
    console.log(report(config, result));
    expect(result.counterexample?.violation).toMatch(/OwnEntry: [AB] is in the body \(run 0\) without an entry stamped with its run/);
    expect(result.counterexample!.trace.some((s) => /the body fails/.test(s.label))).toBe(true);
  });

  test('F5: a sweep without a grace period frees a live permit on a stale "does not exist"', () => {
    const config = configNamed('sweep-stale');
    const result = checkConfig(config, { mutate: (system) => ({ ...system, reconciler: { ...system.reconciler, graceMs: 0 } }) });
    console.log(report(config, result));
    expect(result.counterexample?.violation).toMatch(/OwnEntry|inside at once/);
    expect(result.counterexample!.trace.some((s) => /DOES_NOT_EXIST run 0 \(stale\)/.test(s.label))).toBe(true);
  });

  test('F6: an acquire that cannot tell its own entry from a full lock polls forever beside it', () => {
    // Its own entry of its current run: an acquire that landed but whose response was lost (the
    // sweep frees an entry of an earlier run by itself).
    const config = configNamed('polling-server-errors');
    const result = checkConfig(config, {
      mutate: mutateWorkflow((state) => {
        if (state.Parameters?.ConditionExpression === ACQUIRE_CONDITION) {
          state.Parameters.ConditionExpression = '(attribute_not_exists(#permits) OR #permits < :limit) AND attribute_not_exists(#holder)';
        }
      }),
    });
    console.log(report(config, result));
    expect(result.counterexample?.violation).toMatch(/never finishes/);
    expect(result.counterexample!.fairRun!.some((s) => /Poll For Permit/.test(s.label))).toBe(true);
  });

  test('ticket layout: a claim that does not move the head serves the same ticket again and again, and its releaser never finishes', () => {
    // Releasers that give back permits at once must claim different tickets; one that claims the
    // ticket it just served (its waiter now holds the permit, so the hand-off is refused) loops.
    // The loop needs no fault: searched without queue-stops' stop and redrive, it is found in seconds
    // (the liveness of a loop without waits is judged when the search is done: with the faults, after
    // all 182,408 states, in more than three minutes).
    const config = { ...configNamed('queue-stops'), budget: { ...NO_FAULTS } };
    const result = checkConfig(config, {
      mutate: mutateWorkflow((state) => {
        const p = state.Parameters;
        if (p?.UpdateExpression !== PEEK_UPDATE) return;
        p.UpdateExpression = 'SET #head = #head';
        delete p.ExpressionAttributeValues[':one'];
      }),
    });
    console.log(report(config, result));
    expect(result.counterexample?.violation).toMatch(/never finishes/);
    expect(result.counterexample!.fairRun!.some((s) => /Serve Ticket/.test(s.label))).toBe(true);
  });

  test('a wake-up that failed with Sfn.SfnException, sent again blindly: a retry that hears TaskTimedOut takes back the permit in use', () => {
    // The real release confirms with SendTaskHeartbeat first, and never takes back after a second wake-up.
    const config = configNamed('queue-failed-wake-ups');
    let planted = 0;
    const result = checkConfig(config, {
      mutate: mutateWorkflow((state, name) => {
        if (!String(state.Resource).endsWith(':sfn:sendTaskSuccess')) return;
        for (const c of state.Catch ?? []) {
          if (c.Next === 'Is Waiter Still Waiting') (c.Next = 'Wake Next Waiter Again'), planted++;
        }
        if (name === 'Wake Next Waiter Again') {
          state.Catch.unshift({ ErrorEquals: ['Sfn.TaskTimedOutException'], ResultPath: null, Next: 'Take Back Permit' });
          planted++;
        }
      }),
    });
    console.log(report(config, result));
    expect(planted).toBe(2);
    expect(result.counterexample?.violation).toMatch(/OwnEntry: B is in the body \(run 0\) without an entry stamped with its run/);
    expect(result.counterexample!.trace.some((s) => /Sfn\.SfnException/.test(s.label))).toBe(true);
    expect(result.counterexample!.trace.some((s) => /Take Back Permit/.test(s.label))).toBe(true);
  });

  test('Leave Queue: a redriven run that goes in on the entry of the run before, without claiming it, is found', () => {
    // The real definition sends a run redriven at Leave Queue (always refused: its ticket is the run
    // before's) to Check Handed-Off Permit Again. Planted: it goes in as a first run does.
    const config = configNamed('queue-timeouts-redrive');
    let planted = 0;
    const result = checkConfig(config, {
      mutate: mutateWorkflow((state, name) => {
        if (name !== STATE.leaveQueue) return;
        for (const c of state.Catch) (c.Next = STATE.ticketLeftInQueue), planted++;
      }),
    });
    console.log(report(config, result));
    expect(planted).toBe(1);
    expect(result.counterexample?.violation).toMatch(/OwnEntry: B is in the body \(run 1\) without an entry stamped with its run/);
    expect(result.counterexample!.trace.some((s) => /Leave Queue/.test(s.label))).toBe(true);
  });

  test('a concurrency limit above the rate: a release at the interval that hands off the whole entry moves the body\'s slot with it', () => {
    // The real release hands on the permit alone and keeps the slot (Hand Off Keeping Body Slot).
    // Planted: it hands off the entry as a whole, slot and all, while the body runs on.
    const config = configNamed('rate-above-limit');
    let planted = 0;
    const result = checkConfig(config, {
      mutate: mutateWorkflow((state, name) => {
        if (name !== `${STATE.handOffKeepingSlot}${RELEASE_AT_INTERVAL_SUFFIX}`) return;
        state.Parameters.ConditionExpression = HAND_OFF_CONDITION;
        state.Parameters.UpdateExpression = HAND_OFF_UPDATE;
        state.Parameters.ExpressionAttributeNames['#permits'] = 'permitsInUse';
        state.Parameters.ExpressionAttributeNames['#bodies'] = 'bodiesRunning';
        planted++;
      }),
    });
    console.log(report(config, result));
    expect(planted).toBe(1);
    expect(result.counterexample?.violation).toMatch(/BodySlot: [AB] runs its body \(run 0\) without a body slot/);
    expect(result.counterexample!.trace.some((s) => /Hand Off Keeping Body Slot/.test(s.label))).toBe(true);
  });

  test('a concurrency limit above the rate: a hand-off that keeps the slot but forgets to take the permit off the releaser counts one permit twice', () => {
    const config = configNamed('rate-above-limit');
    const result = checkConfig(config, {
      mutate: mutateWorkflow((state, name) => {
        if (name !== `${STATE.handOffKeepingSlot}${RELEASE_AT_INTERVAL_SUFFIX}`) return;
        state.Parameters.UpdateExpression = state.Parameters.UpdateExpression.replace(`, #holder.${HOLDER_PERMITS} = :zero`, '');
        delete state.Parameters.ExpressionAttributeValues[':zero'];
        state.Parameters.ConditionExpression = state.Parameters.ConditionExpression.replace(
          ` AND (attribute_not_exists(#holder.${HOLDER_PERMITS}) OR #holder.${HOLDER_PERMITS} > :zero)`,
          '',
        );
      }),
    });
    console.log(report(config, result));
    expect(result.counterexample?.violation).toMatch(/permitsInUse is 1 but 2 holders have entries holding 2/);
  });

  test('a concurrency limit above the rate: a redrive guard that takes a permit into an entry of no permit without counting it', () => {
    // The guard's write lives in the reconciler's flow (lambda/reconciler-flows.ts), not in a definition:
    // planted into a fresh copy of the lock schema, which the checker and the flow then load.
    let result: ReturnType<typeof checkConfig> | undefined;
    let planted = '';
    jest.isolateModules(() => {
      const schema = jest.requireActual('../src/private/lock-schema');
      planted = schema.RETAKE_PERMIT_IN_SLOT_UPDATE.replace('#permits = #permits + :one', '#permits = #permits + :zero');
      jest.doMock('../src/private/lock-schema', () => ({ ...schema, RETAKE_PERMIT_IN_SLOT_UPDATE: planted }));
      // A require inside isolateModules is how Jest loads a module against the planted schema.
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      const isolated: typeof import('../checker/run') = require('../checker/run');
      const config = configNamed('rate-above-limit-redrive');
      result = isolated.checkConfig(config);
      console.log(isolated.report(config, result));
    });
    expect(planted).not.toBe(RETAKE_PERMIT_IN_SLOT_UPDATE);
    expect(result!.counterexample?.violation).toMatch(/permitsInUse is 0 but 1 holders have entries holding 1/);
    expect(result!.counterexample!.trace.some((s) => /guard-A/.test(s.label) && s.label.includes(`#holder.${HOLDER_PERMITS} = :zero`))).toBe(true);
  });

  test('a client that goes next: a completion without the collector\'s gate takes a permit beside the holder', () => {
    // The client's writes live in its flows (client/semaphore-client.ts): planted into a fresh copy of the lock schema.
    let result: ReturnType<typeof checkConfig> | undefined;
    let planted = '';
    jest.isolateModules(() => {
      const schema = jest.requireActual('../src/private/lock-schema');
      planted = schema.CLIENT_COMPLETE_COLLECTOR_CONDITION.replace(' AND #permits <= #collectGate', '');
      jest.doMock('../src/private/lock-schema', () => ({ ...schema, CLIENT_COMPLETE_COLLECTOR_CONDITION: planted }));
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      const isolated: typeof import('../checker/run') = require('../checker/run');
      const config = configNamed('client-collects');
      result = isolated.checkConfig(config);
      console.log(isolated.report(config, result));
    });
    expect(planted).not.toBe(CLIENT_COMPLETE_COLLECTOR_CONDITION);
    expect(result!.counterexample?.violation).toMatch(/2 inside at once .* limit 1|permitsInUse is 2/);
    expect(result!.counterexample!.trace.some((s) => /client-1/.test(s.label) && s.label.includes(`#holder.${HOLDER_COLLECTING}`))).toBe(true);
  });

  test('the claim is what the model runs: the planted change above touched the real definition', () => {
    // Guards the mutations against going stale: the expressions they look for are in the definition.
    const system = configNamed('queue-stops');
    const seen: string[] = [];
    checkConfig(system, {
      maxStates: 1,
      liveness: false,
      mutate: mutateWorkflow((state) => seen.push(state.Parameters?.UpdateExpression, state.Parameters?.ConditionExpression)),
    });
    expect(seen).toEqual(expect.arrayContaining([CLAIM_UPDATE, CLAIM_CONDITION, ACQUIRE_CONDITION, HAND_OFF_CONDITION, PEEK_UPDATE]));
  });
});
