import { marshall, unmarshall } from '@aws-sdk/util-dynamodb';
import { AslHost, BranchEnd, isEnd, Leaf, Thread } from './asl';
import { AttributeValue, clone, DeleteItemInput, DynamoDbError, Item, ModelDynamoDb, stableStringify, UpdateItemInput, UpdateItemOutput } from './dynamodb-model';
import { BODY_TASK, MachineInfo, System } from './system';
import { Effect, Flow } from '../client/effects';
import { abandonCollecting, acquireAttempt, ClientProtocolOptions, completeCollecting, registerCollector, releaseHolder, shouldCollect } from '../client/semaphore-client';
import { guardRedrive, sweep } from '../lambda/reconciler-flows';
import { stepFunctionsDynamoErrorName } from '../simulator/dynamodb';
import {
  BODIES_RUNNING,
  COLLECTING,
  HOLDER_ACQUIRED_AT,
  HOLDER_COLLECTING,
  HOLDER_EXTRA_PERMITS,
  HOLDER_HANDOFF_ID,
  HOLDER_IN_BODY,
  HOLDER_PERMITS,
  HOLDER_REDRIVE_COUNT,
  LOCK_KEY,
  executionHolderKeyOfArn,
  PERMITS_IN_USE,
} from '../src/private/lock-schema';
import { RELEASE_AT_INTERVAL_FAILED, RELEASE_AT_INTERVAL_SUFFIX, STATE } from '../src/private/state-names';

/*
 * The model the checker explores: executions of the synthesized workflow and cleanup state machines
 * (run by the ASL interpreter), the reconciler's sweep and redrive guard and the client (run as the
 * very flows production runs), one lock table, and the faults the protocol must survive. Every
 * conditional write is one atomic step; so is every other call. Time is abstract: it passes in
 * "ticks", each longer than any grace period and any window of eventual consistency.
 *
 * Non-determinism, each bounded by a budget:
 * - stops of executions (workflow or cleanup) anywhere, with the write they had on its way landing
 *   later (`inFlight`), and redrives, which resume the stopped threads with the run + 1;
 * - server errors: a write that lands but whose response is lost, or one that does not land;
 * - callback waits that time out, wake-ups lost (SendTaskSuccess reported done, never delivered);
 * - status events delivered late and out of order (always), duplicated, or lost; a failing guard
 *   retried by Lambda (three attempts);
 * - stale reads of DescribeExecution, GetExecutionHistory and ListExecutions: any view since the last
 *   tick (an execution started since then may not exist yet);
 * - sweeps, client leases (and their crashes), failing bodies, ticks.
 */

/** How far the model's executions and faults may go. */
export interface Budget {
  /** Stops of executions (StopExecution, time-outs) and crashes of clients. */
  stops: number;
  /** Of the stops, how many may leave a write on its way, to land later. */
  inFlight: number;
  redrives: number;
  /** Server errors after a write landed (the response lost), or before it did. */
  serverErrors: number;
  /**
   * DynamoDB calls of the workflow throttled past their retries: not applied, and the task fails with
   * its retries used up (its Catch decides).
   */
  exhaustedRetries: number;
  /** Callback waits (`.waitForTaskToken`) that time out. */
  timeouts: number;
  lostWakeUps: number;
  /**
   * SendTaskSuccess calls of tasks that fail with `Sfn.SfnException` (throttling, or an error outside
   * the API model): not applied, or applied with the response lost.
   */
  failedWakeUps: number;
  lostEvents: number;
  duplicateEvents: number;
  staleReads: number;
  /** Sweeps of the lock table (holders and queues). */
  sweeps: number;
  /** Sweeps of the redriven executions that still run (the redrive guard's backstop). */
  backstops: number;
  ticks: number;
  bodyFailures: number;
}

export const NO_FAULTS: Budget = {
  stops: 0,
  inFlight: 0,
  redrives: 0,
  serverErrors: 0,
  exhaustedRetries: 0,
  timeouts: 0,
  lostWakeUps: 0,
  failedWakeUps: 0,
  lostEvents: 0,
  duplicateEvents: 0,
  staleReads: 0,
  sweeps: 0,
  backstops: 0,
  ticks: 0,
  bodyFailures: 0,
};

/** What DescribeExecution says of an execution: one view per change since the last tick. */
interface View {
  readonly status: string; // RUNNING, SUCCEEDED, FAILED, ABORTED, or DOES_NOT_EXIST
  readonly redriveCount: number;
}

export interface Exec {
  readonly arn: string;
  readonly name: string;
  readonly machine: 'workflow' | 'cleanup';
  readonly input: unknown;
  readonly startTime: string;
  status: 'RUNNING' | 'SUCCEEDED' | 'FAILED' | 'ABORTED';
  run: number;
  /** Where its threads are: while it runs, and after a stop (for a redrive). */
  root?: Thread;
  error?: string;
  views: View[];
  /** For each redrive: where the run resumed, and when. */
  redrives: Array<{ at: string; resumedAt: string }>;
  /**
   * The state this execution entered last, while a redrive is left in the budget: the one its history
   * shows last before a redrive, which the guard reads (with Parallel branches, whichever moved last).
   */
  lastEntered?: string;
  /**
   * With a rate alone, once redriven: the run in which the body started (again), the run in which the
   * branch beside it began its hold (entered its Prepare; unset: the first), and the run that holds a
   * permit (or whose guard finished).
   */
  bodyRun?: number;
  holdRun?: number;
  protectedRun?: number;
  /**
   * With a rate alone: the branch beside the body began its hold (entered its Prepare) and has not
   * begun its release, nor has the failure path waited out its interval: a failed body's permit is
   * owed its interval.
   */
  holdOwed?: boolean;
  /** The state whose DynamoDB call was throttled past its retries (the fault `exhaustedRetries`). */
  throttledIn?: string;
  /** Counter of tokens and ids it drew. */
  seq: number;
  inBody?: boolean;
  /** In the body with a permit the protocol gave it (not resumed there by a redrive and not yet guarded). */
  guarded?: boolean;
}

/** A pending delivery of an event. */
interface PendingEvent {
  readonly kind: 'status' | 'redrive';
  readonly arn: string;
  readonly status: string;
  readonly run: number;
  readonly time: string;
  /** Lambda's attempt at the guard, from 1. */
  readonly attempt: number;
  /** How many deliveries of this event happened already (names the cleanup executions). */
  readonly delivered: number;
}

/** A call on its way when its caller stopped (a DynamoDB write, a SendTaskSuccess): it lands at some later step. */
interface LateWrite {
  readonly owner: string;
  readonly state: string;
  readonly kind: 'dynamodb' | 'sendTaskSuccess';
  readonly input: Record<string, any>;
}

type Answer = { ok: unknown } | { err: { name: string; message: string } };

interface Actor {
  readonly id: string;
  readonly kind: 'sweep' | 'backstop' | 'guard' | 'client';
  readonly args: any;
  answers: Answer[];
}

export interface World {
  tables: Record<string, Record<string, Item>>;
  execs: Exec[];
  events: PendingEvent[];
  late: LateWrite[];
  actors: Actor[];
  budget: Budget;
  clock: number;
  /** What the invariants remember: the last fencing token seen at body entry, wake-ups per hand-off. */
  ghost: { lastFence?: number; fenceViolation?: string; wakes: Record<string, number>; guardGaveUp: number };
  /** A fair run's world: its sweeps are whole (holders and redriven executions). */
  fair?: boolean;
}

/** One step of the model: what happened, and the world after it. */
export interface Step {
  readonly label: string;
  readonly world: World;
  /** Only the passing of time brings it: a callback wait's time-out, a sweep, a tick. */
  readonly time?: boolean;
}

/** The model's configuration. */
export interface ModelOptions {
  readonly system: System;
  /** Workflow executions, all started at the beginning. */
  readonly executions: number;
  /** Client leases (scripts), each acquiring once and releasing, or crashing. */
  readonly clients?: number;
  /** How many permits each client lease takes (`--permits`); its release hands them on one at a time. @default 1 */
  readonly clientPermits?: number;
  /**
   * A client refused while executions queue goes next, as the CLI's waiting acquire does: it registers as
   * the lock's collector, looks up to twice whether its permits are free (it may crash between looks), and
   * gives its place up if not. @default false: it acquires once
   */
  readonly clientCollects?: boolean;
  readonly budget: Budget;
  /** Told of every UpdateItem the model evaluates (for the conformance test against dynalite). */
  readonly onUpdateItem?: (call: RecordedUpdate) => void;
  /** The widest window of ticket numbers a world may name (default DEFAULT_TICKET_WINDOW). */
  readonly ticketWindow?: number;
}

/** An UpdateItem as the model evaluated it: the item before, the request, the outcome, the item after. */
export interface RecordedUpdate {
  readonly before?: Item;
  /** An UpdateItem, or a DeleteItem (no `UpdateExpression`). */
  readonly input: UpdateItemInput | (DeleteItemInput & { readonly UpdateExpression?: undefined });
  /** The error's name, or undefined when the write was applied. */
  readonly error?: string;
  readonly attributes?: Item;
  readonly after?: Item;
}

/**
 * The widest window of ticket numbers a searched world may refer to, by default (see `successors`):
 * from the oldest ticket anything still names (a ticket item, an execution's state, a flow's answers)
 * to the newest the lock issued. One: the ticket that waits, and the one before it (a skipped or
 * served ticket whose item is still there). The configurations for the queue's own races widen it to
 * two (an orphan or a skipped ticket beside a waiting one); `--tickets N` sets it for a run.
 */
export const DEFAULT_TICKET_WINDOW = 1;

/**
 * Where a world's key names a ticket number: the lock item's counters (also in the answers flows
 * replay), a ticket item's key (lock name, U+001F, ticket; JSON writes U+001F as `\u001f`), and the
 * `ticket` field of an execution's state data.
 */
const TICKET_REFERENCES = /("queue(?:Head|Tail)":\{"N":")(\d+)("\})|(\\u001f)(\d+)|("ticket":)(\d+)/g;

/**
 * A key with its ticket numbers shifted so that the oldest it names is 0, and the window they span.
 * The protocol only ever compares tickets with each other and adds one to them, so a world and the
 * world with every ticket number shifted alike behave alike: they share a key (as names do, below).
 */
export function canonicalTickets(text: string): { text: string; span: number } {
  let min = Infinity;
  let max = -Infinity;
  for (const m of text.matchAll(TICKET_REFERENCES)) {
    const n = Number(m[2] ?? m[5] ?? m[7]);
    if (n < min) min = n;
    if (n > max) max = n;
  }
  if (min === Infinity) return { text, span: 0 };
  if (min === 0) return { text, span: max };
  const shifted = text.replace(TICKET_REFERENCES, (...m: Array<string | undefined>) =>
    m[1] !== undefined ? `${m[1]}${Number(m[2]) - min}${m[3]}` : m[4] !== undefined ? `${m[4]}${Number(m[5]) - min}` : `${m[6]}${Number(m[7]) - min}`,
  );
  return { text: shifted, span: max - min };
}

/** A task token's or a UUID's sequence number (`tok:<name>:<run>:<n>`, `uuid:<name>:<run>:<n>`): see canonicalSequence. */
const SEQUENCE_REFERENCES = /\b(tok|uuid):([^:"\\]+):(\d+):(\d+)\b/g;

/**
 * A key with the sequence numbers of each execution's tokens and UUIDs replaced by their rank among
 * those the world still names. The protocol only compares tokens and UUIDs for equality, and an
 * execution's next one is fresh whatever its counter (`Exec.seq`, left out of keys), so worlds that
 * differ only in those numbers behave alike. Without this a loop that draws a UUID each round (a
 * releaser serving the same ticket again and again) makes a new world every round, and the search
 * never ends to find that the loop never finishes.
 */
export function canonicalSequence(text: string): string {
  const used = new Map<string, number[]>();
  for (const m of text.matchAll(SEQUENCE_REFERENCES)) {
    const list = used.get(m[2]) ?? [];
    list.push(Number(m[4]));
    used.set(m[2], list);
  }
  if (used.size === 0) return text;
  const rank = new Map<string, Map<number, number>>();
  for (const [name, list] of used) rank.set(name, new Map([...new Set(list)].sort((a, b) => a - b).map((n, i) => [n, i + 1])));
  return text.replace(SEQUENCE_REFERENCES, (_m, kind: string, name: string, run: string, n: string) => `${kind}:${name}:${run}:${rank.get(name)!.get(Number(n))}`);
}

const BASE_TIME = Date.parse('2026-01-01T00:00:00.000Z');
/** One tick: longer than any grace period and any window of eventual consistency. */
export const TICK_MS = 15 * 60 * 1000;
/** A client lease: shorter than a tick, so that a crashed client's lease has expired after one. */
const CLIENT_LEASE_SECONDS = 60;
/** Effect a client flow yields while it holds its permit; its next step releases. */
const HOLDING = { service: 'model', action: 'hold' } as unknown as Effect;
/** Effect a client flow yields between the looks of its collection; its next step looks again. */
const COLLECT_LOOK = { service: 'model', action: 'collect' } as unknown as Effect;
/** How many times a collecting client looks whether its permits are free before it gives its place up. */
const CLIENT_LOOKS = 2;


export class Model {
  private readonly s: System;

  /** Every world's key but its budget, by world (a world is keyed as a successor, then for its fair run). */
  private readonly partsCache = new WeakMap<World, string>();
  /** The workflow has a wait for a body slot, whose rounds keyParts caps (with a JSON.stringify replacer, which makes it slower). */
  private readonly slotWaits: boolean;
  private readonly spanCache = new WeakMap<World, number>();

  constructor(private readonly options: ModelOptions) {
    this.s = options.system;
    this.slotWaits = JSON.stringify(this.s.workflow.machine.definition).includes(JSON.stringify(STATE.waitForBodySlot));
  }

  // ---- the initial world ----

  public initial(): World {
    const world: World = {
      tables: { [this.s.tableName]: {} },
      execs: [],
      events: [],
      late: [],
      actors: [],
      budget: { ...this.options.budget },
      clock: 0,
      ghost: { wakes: {}, guardGaveUp: 0 },
    };
    for (let i = 0; i < this.options.executions; i++) {
      const name = String.fromCharCode(65 + i); // A, B, C...
      const exec: Exec = {
        arn: `${this.s.workflow.arn.replace(':stateMachine:', ':execution:')}:${name}`,
        name,
        machine: 'workflow',
        input: {},
        startTime: iso(world.clock),
        status: 'RUNNING',
        run: 0,
        // Just started: it may not be visible to DescribeExecution yet.
        views: [{ status: 'DOES_NOT_EXIST', redriveCount: 0 }, { status: 'RUNNING', redriveCount: 0 }],
        redrives: [],
        seq: 0,
      };
      this.startThreads(world, exec);
      world.execs.push(exec);
    }
    for (let i = 0; i < (this.options.clients ?? 0); i++) {
      this.spawn(world, { id: `client-${i + 1}`, kind: 'client', args: { leaseId: `lease-${i + 1}` }, answers: [] });
    }
    this.afterStep(world, undefined);
    return world;
  }

  // ---- successors ----

  /** Every step the world can take, faults included. */
  public successors(world: World): Step[] {
    const steps: Step[] = [];
    const b = world.budget;
    for (const exec of world.execs) {
      if (exec.status === 'RUNNING' && exec.root) {
        for (const leaf of this.info(exec).machine.leaves(exec.root)) steps.push(...this.leafSteps(world, exec, leaf));
        if (b.stops > 0) steps.push(...this.stop(world, exec.arn, 'stopped', true));
      } else if (exec.root && exec.status !== 'SUCCEEDED' && b.redrives > 0) {
        steps.push(this.mutate(world, `${exec.name}: redriven`, (w) => this.redrive(w, this.exec(w, exec.arn))));
      }
    }
    world.late.forEach((late, i) => {
      steps.push(
        this.mutate(world, `the call of ${shortName(late.owner)} '${late.state}' lands late`, (w) => {
          w.late.splice(i, 1);
          if (late.kind === 'sendTaskSuccess') {
            this.sendTaskSuccess(w, late.input.TaskToken, late.input.Output);
            return;
          }
          try {
            this.db(w).updateItem(late.input as any);
          } catch (e) {
            if (!(e instanceof DynamoDbError)) throw e;
          }
        }),
      );
    });
    for (const actor of world.actors) steps.push(...this.actorSteps(world, actor));
    if (b.sweeps > 0 && !world.actors.some((a) => a.kind === 'sweep')) {
      steps.push(
        this.mutate(world, 'the reconciler sweeps', (w) => (w.budget.sweeps--, this.spawn(w, { id: `sweep-${w.budget.sweeps}`, kind: 'sweep', args: { whole: w.fair === true }, answers: [] }))),
      );
    }
    if (b.backstops > 0 && !world.actors.some((a) => a.kind === 'backstop')) {
      steps.push(
        this.mutate(world, 'the reconciler guards redriven executions', (w) => (w.budget.backstops--, this.spawn(w, { id: `backstop-${w.budget.backstops}`, kind: 'backstop', args: {}, answers: [] }))),
      );
    }
    // Clients renew their leases while they hold them: time passes only when none does.
    if (b.ticks > 0 && !world.actors.some((a) => a.kind === 'client' && this.holding(world, a))) {
      steps.push(this.mutate(world, 'time passes', (w) => this.tick(w)));
    }
    // Tickets only ever grow: a waiter skipped while on its way takes a new one, which a releaser may
    // skip again, without end when the scheduler wants it. The search stays within a window of
    // ticket numbers (keys shift them: see canonicalTickets).
    const window = this.options.ticketWindow ?? DEFAULT_TICKET_WINDOW;
    return steps.flatMap((step) => this.deliverEvents(step)).filter((step) => this.ticketSpan(step.world) <= window);
  }

  /**
   * Events a step emitted are delivered at once, lost, or delivered twice. Delivering at once loses
   * nothing: a delivery only starts a cleanup execution or a guard at its first step, and those steps
   * can still come at any later moment, so a late event is a cleanup or a guard whose steps come late.
   */
  private deliverEvents(step: Step): Step[] {
    if (step.world.events.length === 0) return [step];
    const event = step.world.events[0];
    const what = `${event.kind === 'status' ? `${event.status} event` : 'RUNNING event (redriven)'} of ${shortName(event.arn)} run ${event.run}`;
    const variants: Step[] = [];
    const variant = (label: string, op: (w: World) => void) => {
      const w = clone(step.world);
      op(w);
      this.afterStep(w, label);
      variants.push({ label: `${step.label}; ${label}`, world: w, time: step.time });
    };
    variant(`${what} delivered`, (w) => this.deliver(w, 0, false));
    if (step.world.budget.duplicateEvents > 0) {
      variant(`${what} delivered twice`, (w) => {
        w.budget.duplicateEvents--;
        this.deliver(w, 0, true);
        this.deliver(w, w.events.findIndex((e) => e.arn === event.arn && e.kind === event.kind && e.run === event.run), false);
      });
    }
    if (step.world.budget.lostEvents > 0) variant(`${what} lost`, (w) => (w.budget.lostEvents--, w.events.splice(0, 1)));
    return variants.flatMap((v) => this.deliverEvents(v));
  }

  /** A step of one thread of an execution. */
  private leafSteps(world: World, exec: Exec, leaf: Leaf): Step[] {
    const info = this.info(exec);
    const state = info.machine.state(leaf.thread.state);
    const who = `${exec.name}: '${leaf.thread.state}'`;
    const steps: Step[] = [];
    const b = world.budget;
    if (state.Type === 'Wait') {
      // A Wait state is time passing for its execution: the fair run lets it pass in turn with the others.
      const step = this.onLeaf(world, exec, leaf, `${who} waits`, (w, e, root) => info.machine.waitOver(root, leaf.path, this.host(w, e)));
      steps.push({ ...step, time: true });
      return steps;
    }
    const resource: string = state.Resource;
    const callback = resource.endsWith('.waitForTaskToken');
    if (callback && leaf.thread.token !== undefined) {
      // Waiting on its token: someone wakes it, or it times out.
      if (state.TimeoutSeconds !== undefined && b.timeouts > 0) {
        steps.push(
          this.onLeaf(world, exec, leaf, `${who} times out`, (w, e, root) => {
            w.budget.timeouts--;
            return info.machine.fail(root, leaf.path, 'States.Timeout', 'the callback did not come in time', this.host(w, e));
          }),
        );
      }
      return steps;
    }
    const dynamo = /^arn:aws:states:::(aws-sdk:)?dynamodb:([a-zA-Z]+)(\.waitForTaskToken)?$/.exec(resource);
    if (dynamo) {
      const sdk = dynamo[1] !== undefined;
      const action = dynamo[2];
      if (action !== 'updateItem' && action !== 'getItem' && action !== 'deleteItem') throw new Error(`the checker has no model of DynamoDB ${action} (state '${leaf.thread.state}')`);
      steps.push(this.onLeaf(world, exec, leaf, `${who}`, (w, e, root) => this.dynamoTask(w, e, root, leaf, sdk, action, callback, 'normal')));
      if (b.serverErrors > 0 && action !== 'getItem') {
        const wouldLand = this.probe(world, exec, leaf, callback, action);
        if (wouldLand) {
          steps.push(this.onLeaf(world, exec, leaf, `${who} lands, its response lost (server error)`, (w, e, root) => (w.budget.serverErrors--, this.dynamoTask(w, e, root, leaf, sdk, action, callback, 'lost'))));
        }
        steps.push(this.onLeaf(world, exec, leaf, `${who} fails before it lands (server error)`, (w, e, root) => (w.budget.serverErrors--, this.dynamoTask(w, e, root, leaf, sdk, action, callback, 'unapplied'))));
      }
      if (b.exhaustedRetries > 0 && exec.machine === 'workflow') {
        const throttled = stepFunctionsDynamoErrorName(sdk, 'ProvisionedThroughputExceededException');
        steps.push(
          this.onLeaf(world, exec, leaf, `${who} is throttled past its retries`, (w, e, root) => {
            w.budget.exhaustedRetries--;
            // Only the release beside the body's is checked (below): elsewhere, not to split worlds.
            if (leaf.thread.state.endsWith(RELEASE_AT_INTERVAL_SUFFIX)) e.throttledIn = leaf.thread.state;
            return info.machine.fail(root, leaf.path, throttled, 'throttled past its retries', this.host(w, e), { retriesExhausted: true });
          }),
        );
      }
      return steps;
    }
    if (resource === 'arn:aws:states:::aws-sdk:sfn:sendTaskSuccess') {
      steps.push(this.onLeaf(world, exec, leaf, `${who}`, (w, e, root) => this.wakeTask(w, e, root, leaf, false)));
      if (b.lostWakeUps > 0) steps.push(this.onLeaf(world, exec, leaf, `${who}: the wake-up is lost`, (w, e, root) => (w.budget.lostWakeUps--, this.wakeTask(w, e, root, leaf, true))));
      if (b.failedWakeUps > 0) {
        steps.push(
          this.onLeaf(world, exec, leaf, `${who}: throttled (Sfn.SfnException), not applied`, (w, e, root) => {
            w.budget.failedWakeUps--;
            return info.machine.fail(root, leaf.path, 'Sfn.SfnException', 'Rate exceeded', this.host(w, e));
          }),
          this.onLeaf(world, exec, leaf, `${who}: applied, then fails (Sfn.SfnException)`, (w, e, root) => {
            w.budget.failedWakeUps--;
            const host = this.host(w, e);
            const input = info.machine.taskInput(this.threadAt(root, leaf.path), host) as { TaskToken: string; Output: string };
            // A closed token is refused as ever; an open one is woken, and the caller hears only the error.
            const error = this.sendTaskSuccess(w, input.TaskToken, input.Output);
            if (error) return info.machine.fail(root, leaf.path, `Sfn.${error}${error.endsWith('Exception') ? '' : 'Exception'}`, 'the token is closed', host);
            return info.machine.fail(root, leaf.path, 'Sfn.SfnException', 'Internal error', host);
          }),
        );
      }
      return steps;
    }
    if (resource === 'arn:aws:states:::aws-sdk:sfn:sendTaskHeartbeat') {
      // Succeeds while a task waits on the token; refused once it has ended.
      steps.push(
        this.onLeaf(world, exec, leaf, `${who}`, (w, e, root) => {
          const input = info.machine.taskInput(this.threadAt(root, leaf.path), this.host(w, e)) as { TaskToken: string };
          const waiting = w.execs.some((x) => x.status === 'RUNNING' && x.root && this.info(x).machine.leaves(x.root).some((l) => l.thread.token === input.TaskToken));
          return waiting
            ? info.machine.succeed(root, leaf.path, {}, this.host(w, e))
            : info.machine.fail(root, leaf.path, 'Sfn.TaskTimedOutException', 'the token is closed', this.host(w, e));
        }),
      );
      return steps;
    }
    if (leaf.thread.state === BODY_TASK) {
      steps.push(this.onLeaf(world, exec, leaf, `${exec.name}: the body succeeds`, (w, e, root) => info.machine.succeed(root, leaf.path, { worked: true }, this.host(w, e))));
      if (b.bodyFailures > 0) {
        steps.push(
          this.onLeaf(world, exec, leaf, `${exec.name}: the body fails`, (w, e, root) => {
            w.budget.bodyFailures--;
            return info.machine.fail(root, leaf.path, 'WorkFailed', 'the body failed', this.host(w, e));
          }),
        );
      }
      return steps;
    }
    throw new Error(`the checker has no model of the task '${leaf.thread.state}' (${resource})`);
  }

  /** Whether the write of a DynamoDB task would succeed now. */
  private probe(world: World, exec: Exec, leaf: Leaf, callback: boolean, action: string): boolean {
    const w = clone(world);
    const e = this.exec(w, exec.arn);
    const input = this.info(e).machine.taskInput(leaf.thread, this.host(w, e), callback ? 'probe' : undefined) as any;
    try {
      if (action === 'deleteItem') this.db(w).deleteItem(input);
      else this.db(w).updateItem(input);
      return true;
    } catch (err) {
      if (err instanceof DynamoDbError) return false;
      throw err;
    }
  }

  private dynamoTask(w: World, e: Exec, root: Thread, leaf: Leaf, sdk: boolean, action: string, callback: boolean, mode: 'normal' | 'lost' | 'unapplied'): Thread | BranchEnd {
    const machine = this.info(e).machine;
    const host = this.host(w, e);
    const thread = this.threadAt(root, leaf.path);
    const token = callback ? `tok:${e.name}:${e.run}:${++e.seq}` : undefined;
    const input = machine.taskInput(thread, host, token) as any;
    if (mode === 'unapplied') return machine.fail(root, leaf.path, stepFunctionsDynamoErrorName(sdk, 'InternalServerError'), 'server error', host);
    let result: unknown;
    try {
      result = action === 'getItem' ? this.db(w).getItem(input) : action === 'deleteItem' ? this.db(w).deleteItem(input) : this.db(w).updateItem(input);
    } catch (err) {
      if (!(err instanceof DynamoDbError)) throw err;
      return machine.fail(root, leaf.path, stepFunctionsDynamoErrorName(sdk, err.name), err.message, host);
    }
    if (mode === 'lost') return machine.fail(root, leaf.path, stepFunctionsDynamoErrorName(sdk, 'InternalServerError'), 'server error after the write', host);
    if (callback) {
      thread.token = token;
      return root;
    }
    return machine.succeed(root, leaf.path, result, host);
  }

  private wakeTask(w: World, e: Exec, root: Thread, leaf: Leaf, lost: boolean): Thread | BranchEnd {
    const machine = this.info(e).machine;
    const host = this.host(w, e);
    const input = machine.taskInput(this.threadAt(root, leaf.path), host) as { TaskToken: string; Output: string };
    if (!lost) {
      const error = this.sendTaskSuccess(w, input.TaskToken, input.Output);
      if (error) return machine.fail(root, leaf.path, `Sfn.${error}${error.endsWith('Exception') ? '' : 'Exception'}`, 'the token is closed', host);
    }
    return machine.succeed(root, leaf.path, {}, host);
  }

  /** SendTaskSuccess: wakes the task waiting on the token, or says why not (the SDK's error name). */
  private sendTaskSuccess(w: World, token: string, output: string): string | undefined {
    for (const e of w.execs) {
      if (e.status !== 'RUNNING' || !e.root) continue;
      const leaf = this.info(e).machine.leaves(e.root).find((l) => l.thread.token === token);
      if (!leaf) continue;
      // The woken execution's permit: which hand-off it came from, for "at most one wake per hand-off".
      const entry = this.lockItem(w)?.[holderKey(e)];
      const handoff = entry && 'M' in entry ? (entry.M[HOLDER_HANDOFF_ID] && 'S' in entry.M[HOLDER_HANDOFF_ID] ? entry.M[HOLDER_HANDOFF_ID].S : undefined) : undefined;
      if (handoff !== undefined) w.ghost.wakes[handoff] = (w.ghost.wakes[handoff] ?? 0) + 1;
      const next = this.info(e).machine.succeed(e.root, leaf.path, JSON.parse(output), this.host(w, e));
      this.settle(w, e, next);
      return undefined;
    }
    // Every token in this model was issued: one nobody waits on is closed.
    return token.startsWith('tok:') ? 'TaskTimedOut' : 'InvalidToken';
  }

  // ---- executions ----

  private info(exec: Exec): MachineInfo {
    return exec.machine === 'workflow' ? this.s.workflow : this.s.cleanup;
  }

  private exec(w: World, arn: string): Exec {
    return w.execs.find((e) => e.arn === arn)!;
  }

  private host(w: World, e: Exec): AslHost & { abandoned: Thread[] } {
    const abandoned: Thread[] = [];
    return {
      execution: { id: e.arn, name: e.name, input: e.input, redriveCount: e.run, startTime: e.startTime, stateMachineId: this.info(e).arn },
      now: () => iso(w.clock),
      uuid: () => `uuid:${e.name}:${e.run}:${++e.seq}`,
      entered: (name) => {
        if (w.budget.redrives > 0) e.lastEntered = name;
        if (this.s.releaseAtInterval && e.run > 0 && name === BODY_TASK) e.bodyRun = e.run;
        if (this.s.releaseAtInterval && e.run > 0 && name === STATE.prepareReleaseAtInterval) e.holdRun = e.run;
        // (Its Prepare's name ends with the suffix too: the flag is set after the clearing.)
        const holdEnds =
          name.endsWith(RELEASE_AT_INTERVAL_SUFFIX) || name === RELEASE_AT_INTERVAL_FAILED || name === STATE.prepareReleaseAfterFailure;
        if (e.holdOwed && holdEnds) e.holdOwed = undefined;
        if (this.s.releaseAtInterval && name === STATE.prepareReleaseAtInterval) e.holdOwed = true;
      },
      onAbandon: (thread) => abandoned.push(thread),
      abandoned,
    };
  }

  private threadAt(root: Thread, path: number[]): Thread {
    let t = root;
    for (const i of path) t = t.branches![i] as Thread;
    return t;
  }

  private startThreads(w: World, exec: Exec): void {
    const next = this.info(exec).machine.start(exec.input, this.host(w, exec));
    this.settle(w, exec, next);
  }

  /** Apply a step to one thread of an execution, in a copy of the world. */
  private onLeaf(world: World, exec: Exec, _leaf: Leaf, label: string, op: (w: World, e: Exec, root: Thread) => Thread | BranchEnd): Step {
    return this.mutate(world, label, (w) => {
      const e = this.exec(w, exec.arn);
      const next = op(w, e, e.root!);
      this.settle(w, e, next);
    });
  }

  /** After a step: the execution runs on, or ended. */
  private settle(w: World, e: Exec, next: Thread | BranchEnd): void {
    if (!isEnd(next)) {
      e.root = next;
      return;
    }
    e.root = undefined;
    e.status = next.end === 'ok' ? 'SUCCEEDED' : 'FAILED';
    if (next.end === 'fail') e.error = next.error;
    this.statusChanged(w, e);
    // A cleanup that succeeded has nothing more to do, and nobody asks about it: forget it.
    if (e.machine === 'cleanup' && e.status === 'SUCCEEDED') w.execs = w.execs.filter((x) => x !== e);
  }

  private statusChanged(w: World, e: Exec): void {
    e.views.push({ status: e.status, redriveCount: e.run });
    if (e.machine === 'workflow' && ['FAILED', 'ABORTED'].includes(e.status)) {
      w.events.push({ kind: 'status', arn: e.arn, status: e.status, run: e.run, time: iso(w.clock), attempt: 1, delivered: 0 });
      sortEvents(w);
    }
  }

  /** Stop an execution (StopExecution, or a time-out): its threads end; a write on its way may land later. */
  private stop(world: World, arn: string, why: string, budgeted: boolean): Step[] {
    const exec = this.exec(world, arn);
    const writes = exec.root ? this.info(exec).machine.leaves(exec.root).filter((l) => this.isWrite(exec, l)) : [];
    const variants: Array<LateWrite | undefined> = [undefined];
    if (world.budget.inFlight > 0) {
      for (const leaf of writes) {
        const w = clone(world);
        const e = this.exec(w, arn);
        const token = this.info(e).machine.state(leaf.thread.state).Resource.endsWith('.waitForTaskToken') ? `tok:${e.name}:${e.run}:stopped` : undefined;
        const kind = this.info(e).machine.state(leaf.thread.state).Resource.includes(':sfn:sendTaskSuccess') ? 'sendTaskSuccess' : 'dynamodb';
        const input = this.info(e).machine.taskInput(leaf.thread, this.host(w, e), token) as any;
        variants.push({ owner: arn, state: leaf.thread.state, kind, input });
      }
    }
    return variants.map((late) =>
      this.mutate(world, `${exec.name}: ${why}${late ? ` while its '${late.state}' call is on its way` : ''}`, (w) => {
        if (budgeted) w.budget.stops--;
        if (late) {
          w.budget.inFlight--;
          w.late.push(late);
          sortLate(w);
        }
        this.abort(w, this.exec(w, arn));
      }),
    );
  }

  private abort(w: World, e: Exec): void {
    e.status = 'ABORTED';
    this.statusChanged(w, e);
  }

  /** Whether a thread is at a call that changes something (a DynamoDB write, a wake-up) not yet answered: it could be on its way. */
  private isWrite(exec: Exec, leaf: Leaf): boolean {
    const state = this.info(exec).machine.state(leaf.thread.state);
    return state.Type === 'Task' && /dynamodb:updateItem|sfn:sendTaskSuccess/.test(state.Resource) && leaf.thread.token === undefined;
  }

  /** RedriveExecution: the same threads, where they stopped, their tasks run again; the run + 1. */
  private redrive(w: World, e: Exec): void {
    w.budget.redrives--;
    e.run++;
    e.status = 'RUNNING';
    e.error = undefined;
    const leaves = this.info(e).machine.leaves(e.root!);
    for (const leaf of leaves) {
      leaf.thread.token = undefined;
      leaf.thread.enteredAt = iso(w.clock);
    }
    e.redrives.push({ at: iso(w.clock), resumedAt: e.lastEntered ?? leaves[0]?.thread.state ?? '' });
    // Recorded only while a redrive is left: worlds that differ only by a name nobody will read are one.
    if (w.budget.redrives === 0) for (const x of w.execs) x.lastEntered = undefined;
    else e.lastEntered = undefined;
    if (this.s.releaseAtInterval && leaves.some((l) => l.thread.state === BODY_TASK)) e.bodyRun = e.run;
    e.views.push({ status: 'RUNNING', redriveCount: e.run });
    if (e.machine === 'workflow') {
      // The redrive's RUNNING status-change event, which the redrive guard's rule matches.
      if (this.s.redriveGuard) w.events.push({ kind: 'redrive', arn: e.arn, status: 'RUNNING', run: e.run, time: iso(w.clock), attempt: 1, delivered: 0 });
      sortEvents(w);
      e.inBody = this.inBody(e);
      // Resumed inside the body: it runs there without a permit until the guard acts (see the README).
      e.guarded = false;
    }
  }

  // ---- events ----

  private deliver(w: World, index: number, keep: boolean): void {
    const event = w.events[index];
    if (keep) w.events[index] = { ...event, delivered: event.delivered + 1 };
    else w.events.splice(index, 1);
    sortEvents(w);
    const target = this.exec(w, event.arn);
    if (event.kind === 'status') {
      const name = `cleanup-${target.name}-${event.status}-${event.run}-${event.delivered}`;
      const cleanup: Exec = {
        arn: `${this.s.cleanup.arn.replace(':stateMachine:', ':execution:')}:${name}`,
        name,
        machine: 'cleanup',
        input: this.statusEvent(target, event),
        startTime: iso(w.clock),
        status: 'RUNNING',
        run: 0,
        views: [{ status: 'RUNNING', redriveCount: 0 }],
        redrives: [],
        seq: 0,
      };
      w.execs.push(cleanup);
      this.startThreads(w, cleanup);
    } else {
      this.spawn(w, { id: `guard-${target.name}-${event.run}-${event.attempt}-${event.delivered}`, kind: 'guard', args: { event: this.statusEvent(target, event), attempt: event.attempt }, answers: [] });
    }
  }

  /** A "Step Functions Execution Status Change" event, as EventBridge delivers it (the fields our code reads). */
  private statusEvent(e: Exec, event: PendingEvent): unknown {
    return {
      time: event.time,
      detail: {
        executionArn: e.arn,
        stateMachineArn: this.info(e).arn,
        name: e.name,
        status: event.status,
        redriveCount: event.run,
        input: JSON.stringify(e.input),
        inputDetails: { included: true },
      },
    };
  }

  // ---- actors: the reconciler's flows and the clients ----

  private flow(actor: Actor): Flow<unknown> {
    const config = this.s.reconciler;
    switch (actor.kind) {
      case 'sweep':
        // The fair run's sweeps are whole; the search's are the holders' part, beside backstops.
        return sweep(config, false, undefined, actor.args.whole ? undefined : { holders: true, redriven: false });
      case 'backstop':
        return sweep(config, false, undefined, { holders: false, redriven: true });
      case 'guard':
        return guardRedrive(config, actor.args.event);
      case 'client': {
        const options: ClientProtocolOptions = { tableName: this.s.tableName, clockSkewMs: config.clockSkewMs };
        const lockName = this.s.lockName;
        const limit = this.s.limit;
        const permits = this.options.clientPermits ?? 1;
        const collects = this.options.clientCollects ?? false;
        // On a rate-limited lock, the client names the rate's interval (the CLI's --rate-interval), as
        // one should where it may acquire before any execution has: its acquire records it if none is.
        const rateIntervalSeconds = this.s.rateIntervalSeconds;
        const leaseId = actor.args.leaseId;
        return (function* life(): Flow<unknown> {
          const request = { limit, leaseSeconds: CLIENT_LEASE_SECONDS, permits, rateIntervalSeconds };
          const attempt = yield* acquireAttempt(options, lockName, leaseId, request);
          let lease = attempt.lease;
          if (!lease && collects && shouldCollect(attempt.item)) {
            if (!(yield* registerCollector(options, lockName, leaseId, { limit, permits }))) return 'not acquired';
            for (let look = 0; look < CLIENT_LOOKS && !lease; look++) {
              yield COLLECT_LOOK;
              const collected = yield* completeCollecting(options, lockName, leaseId, { limit, leaseSeconds: CLIENT_LEASE_SECONDS, permits });
              if (collected.gone) return 'registration reclaimed';
              lease = collected.lease;
            }
            if (!lease) return (yield* abandonCollecting(options, lockName, leaseId)) ? 'gave its place up' : 'registration reclaimed';
          }
          if (!lease) return 'not acquired';
          yield HOLDING;
          return yield* releaseHolder(options, lockName, leaseId, permits > 1);
        })();
      }
    }
  }

  /** Replay an actor's flow with its answers: the effect it waits on, or its end. */
  private replay(actor: Actor, stacks = false): { effect?: Effect; done: boolean; error?: unknown } {
    const flow = this.flow(actor);
    // A replay throws the same errors into the flow again and again (and the flow its own, such as the
    // guard's RedriveUndecided): without their stacks the search takes 5% less time. An error that ends
    // the search is made again with its stack (see advance).
    const stackTraceLimit = Error.stackTraceLimit;
    if (!stacks) Error.stackTraceLimit = 0;
    try {
      let step = flow.next();
      for (const answer of actor.answers) {
        if (step.done) break;
        step = 'err' in answer ? flow.throw(Object.assign(new Error(answer.err.message), { name: answer.err.name })) : flow.next(answer.ok);
      }
      return step.done ? { done: true } : { effect: step.value, done: false };
    } catch (e) {
      return { done: true, error: e };
    } finally {
      Error.stackTraceLimit = stackTraceLimit;
    }
  }

  private holding(_w: World, actor: Actor): boolean {
    return actor.kind === 'client' && this.replay(actor).effect === HOLDING;
  }

  private actorSteps(world: World, actor: Actor): Step[] {
    const { effect } = this.replay(actor);
    if (!effect) throw new Error(`actor ${actor.id} has ended but is still listed`);
    if (effect.service === 'clock') {
      // The time, read as the step that follows is taken (time may have passed since the last one).
      const w = clone(world);
      const a = w.actors.find((x) => x.id === actor.id)!;
      a.answers.push({ ok: BASE_TIME + w.clock * TICK_MS });
      this.advance(w, a);
      if (w.actors.includes(a)) return this.actorSteps(w, a);
      this.afterStep(w, undefined);
      return [{ label: `${actor.id}: ends`, world: w }];
    }
    if (effect.service === 'sfn' && ['DescribeExecution', 'GetExecutionHistory', 'ListExecutions'].includes(effect.action)) {
      // Step Functions' reads are eventually consistent: a read answered with the actor's next step,
      // with any view since the last tick (within the stale-read budget), covers the read made at any
      // earlier moment since then. So it takes no step of its own.
      return this.sfnCall(world, actor, effect.action, effect.input).flatMap((read) => {
        const after = read.world.actors.find((x) => x.id === actor.id);
        if (!after) return [read];
        return this.actorSteps(read.world, after).map((next) => ({
          label: `${read.label}, then ${next.label.startsWith(`${actor.id}: `) ? next.label.slice(actor.id.length + 2) : next.label}`,
          world: next.world,
          time: read.time || next.time,
        }));
      });
    }
    const steps: Step[] = [];
    const answer = (label: string, op: (w: World) => Answer) =>
      steps.push(
        this.mutate(world, `${actor.id}: ${label}`, (w) => {
          const a = w.actors.find((x) => x.id === actor.id)!;
          a.answers.push(op(w));
          this.advance(w, a);
        }),
      );
    if ((effect as unknown) === COLLECT_LOOK) {
      answer('looks whether its permits are free', () => ({ ok: undefined }));
      if (world.budget.stops > 0) {
        steps.push(this.mutate(world, `${actor.id}: crashes while it collects`, (w) => (w.budget.stops--, (w.actors = w.actors.filter((a) => a.id !== actor.id)))));
      }
      return steps;
    }
    if ((effect as unknown) === HOLDING) {
      answer('gives its permit back', () => ({ ok: undefined }));
      if (world.budget.stops > 0) {
        steps.push(this.mutate(world, `${actor.id}: crashes while holding its lease`, (w) => (w.budget.stops--, (w.actors = w.actors.filter((a) => a.id !== actor.id)))));
      }
      return steps;
    }
    switch (effect.service) {
      case 'dynamodb':
      case 'document':
        answer(`${effect.action} ${describeRequest(effect.input)}`, (w) => this.dynamoCall(w, effect.service === 'document', effect.action, effect.input));
        return steps;
      case 'sfn':
        return [...steps, ...this.sfnCall(world, actor, effect.action, effect.input)];
      default:
        throw new Error(`unexpected effect ${JSON.stringify(effect)}`);
    }
  }

  /** Start an actor: its local effects are answered at once. */
  private spawn(w: World, actor: Actor): void {
    w.actors.push(actor);
    this.advance(w, actor);
  }

  /** Answer an actor's local effects (the time, ids) at once; drop it when its flow has ended. */
  private advance(w: World, actor: Actor): void {
    for (;;) {
      const { effect, done, error } = this.replay(actor);
      if (done) {
        w.actors = w.actors.filter((a) => a.id !== actor.id);
        if (actor.kind === 'guard' && this.s.releaseAtInterval && (error === undefined || actor.args.attempt >= 3)) {
          // The guard has done what it will for this run: from now on its hold must have a permit.
          const detail = actor.args.event.detail;
          const e = w.execs.find((x) => x.arn === detail.executionArn);
          if (e && e.run === detail.redriveCount) e.protectedRun = e.run;
        }
        if (error !== undefined && actor.kind === 'guard') {
          // A failed invocation: Lambda tries twice more, then gives up (the dead-letter queue).
          if (actor.args.attempt < 3) {
            const detail = actor.args.event.detail;
            w.events.push({ kind: 'redrive', arn: detail.executionArn, status: 'RUNNING', run: detail.redriveCount, time: actor.args.event.time, attempt: actor.args.attempt + 1, delivered: 0 });
            sortEvents(w);
          } else {
            w.ghost.guardGaveUp++;
          }
        } else if (error !== undefined) {
          throw this.replay(actor, true).error ?? error;
        }
        return;
      }
      // The time is read when the flow's next call is made, not now (see actorSteps).
      if (effect!.service === 'uuid') actor.answers.push({ ok: `uuid:${actor.id}:${actor.answers.length}` });
      else return;
    }
  }

  private dynamoCall(w: World, document: boolean, action: string, input: Record<string, any>): Answer {
    const db = this.db(w);
    const request = document ? marshallRequest(input) : input;
    try {
      let out: any;
      switch (action) {
        case 'GetItem':
        case 'Get':
          out = db.getItem(request as any);
          break;
        case 'Scan':
          out = db.scan(request as any);
          break;
        case 'DeleteItem':
          out = db.deleteItem(request as any);
          break;
        default:
          out = db.updateItem(request as any);
      }
      return { ok: document ? unmarshallResponse(out) : out };
    } catch (e) {
      if (e instanceof DynamoDbError) return { err: { name: e.name, message: e.message } };
      throw e;
    }
  }

  private sfnCall(world: World, actor: Actor, action: string, input: Record<string, any>): Step[] {
    const steps: Step[] = [];
    const answer = (label: string, op: (w: World) => Answer) =>
      steps.push(
        this.mutate(world, `${actor.id}: ${label}`, (w) => {
          const a = w.actors.find((x) => x.id === actor.id)!;
          a.answers.push(op(w));
          this.advance(w, a);
        }),
      );
    switch (action) {
      case 'DescribeExecution':
      case 'GetExecutionHistory': {
        const e = world.execs.find((x) => x.arn === input.executionArn);
        const views = e ? e.views : [];
        const current = views.length - 1;
        // The current view; with the budget, any earlier one since the last tick (eventual consistency).
        const candidates = e ? views.map((_v, i) => i).filter((i) => i === current || world.budget.staleReads > 0) : [-1];
        const seen = new Set<string>();
        for (const i of candidates.reverse()) {
          const view = i < 0 ? { status: 'DOES_NOT_EXIST', redriveCount: 0 } : views[i];
          const key = stableStringify(view);
          if (seen.has(key)) continue;
          seen.add(key);
          const stale = i >= 0 && i !== current;
          const label = `${action} ${shortName(input.executionArn)}: ${view.status} run ${view.redriveCount}${stale ? ' (stale)' : ''}`;
          answer(label, (w) => {
            if (stale) w.budget.staleReads--;
            if (view.status === 'DOES_NOT_EXIST') return { err: { name: 'ExecutionDoesNotExist', message: 'Execution Does Not Exist' } };
            const ex = this.exec(w, input.executionArn);
            return { ok: action === 'DescribeExecution' ? this.describe(ex, view) : this.history(ex, view) };
          });
        }
        return steps;
      }
      case 'ListExecutions': {
        answer(`ListExecutions ${input.statusFilter ?? ''} ${input.redriveFilter ?? ''}`, (w) => ({
          ok: {
            executions: w.execs
              .filter((e) => this.info(e).arn === input.stateMachineArn)
              .filter((e) => {
                const view = e.views[e.views.length - 1];
                return view.status !== 'DOES_NOT_EXIST' && (!input.statusFilter || view.status === input.statusFilter) && (input.redriveFilter !== 'REDRIVEN' || view.redriveCount > 0);
              })
              .map((e) => {
                const latest = e.views[e.views.length - 1];
                return { executionArn: e.arn, status: latest.status, redriveCount: latest.redriveCount };
              }),
          },
        }));
        return steps;
      }
      case 'StopExecution': {
        const e = world.execs.find((x) => x.arn === input.executionArn);
        if (!e || e.status !== 'RUNNING') {
          answer(`StopExecution ${shortName(input.executionArn)} (not running)`, () => ({ ok: {} }));
          return steps;
        }
        // As a stop by anyone: the write the execution had on its way may land later.
        for (const stop of this.stop(world, e.arn, `stopped by ${actor.id} (${input.error})`, false)) {
          const w = stop.world;
          const a = w.actors.find((x) => x.id === actor.id)!;
          const e2 = this.exec(w, e.arn);
          e2.error = input.error;
          a.answers.push({ ok: {} });
          this.advance(w, a);
          this.afterStep(w, undefined);
          steps.push({ label: stop.label, world: w });
        }
        return steps;
      }
      case 'SendTaskSuccess': {
        answer('SendTaskSuccess', (w) => {
          const error = this.sendTaskSuccess(w, input.taskToken, input.output);
          return error ? { err: { name: error, message: 'the token is closed' } } : { ok: {} };
        });
        if (world.budget.lostWakeUps > 0) answer('SendTaskSuccess: the wake-up is lost', (w) => (w.budget.lostWakeUps--, { ok: {} }));
        return steps;
      }
      default:
        throw new Error(`the checker has no model of Step Functions ${action}`);
    }
  }

  private describe(e: Exec, view: View): unknown {
    return {
      executionArn: e.arn,
      stateMachineArn: this.info(e).arn,
      name: e.name,
      status: view.status,
      redriveCount: view.redriveCount,
      input: JSON.stringify(e.input),
      startDate: new Date(e.startTime),
    };
  }

  /** GetExecutionHistory, reverse order, as of a view: the redrives it knows of, each after the state it resumed. */
  private history(e: Exec, view: View): unknown {
    const events: Array<Record<string, unknown>> = [{ type: 'ExecutionStarted', timestamp: new Date(e.startTime) }];
    const runs = view.redriveCount;
    for (let i = 0; i < runs; i++) {
      const r = e.redrives[i];
      events.push({ type: 'TaskStateEntered', timestamp: new Date(r.at), stateEnteredEventDetails: { name: r.resumedAt } });
      events.push({ type: 'ExecutionAborted', timestamp: new Date(r.at) });
      events.push({ type: 'ExecutionRedriven', timestamp: new Date(r.at), executionRedrivenEventDetails: { redriveCount: i + 1 } });
    }
    if (e.root && view.redriveCount === e.run) {
      for (const leaf of this.info(e).machine.leaves(e.root)) events.push({ type: 'TaskStateEntered', timestamp: new Date(leaf.thread.enteredAt), stateEnteredEventDetails: { name: leaf.thread.state } });
    }
    return { events: events.reverse() };
  }

  // ---- time ----

  private tick(w: World): void {
    w.budget.ticks--;
    w.clock++;
    for (const e of w.execs) e.views = [e.views[e.views.length - 1]];
  }

  // ---- plumbing ----

  private db(w: World): ModelDynamoDb {
    const db = new ModelDynamoDb(w.tables, { [this.s.tableName]: this.s.keySchema });
    const record = this.options.onUpdateItem;
    if (!record) return db;
    const recorded = <I extends RecordedUpdate['input']>(write: (input: I) => UpdateItemOutput) => (input: I) => {
      const item = () => db.getItem({ TableName: input.TableName, Key: input.Key }).Item;
      const before = item();
      try {
        const out = write(input);
        record({ before, input: clone(input), attributes: out.Attributes, after: item() });
        return out;
      } catch (e) {
        if (e instanceof DynamoDbError) record({ before, input: clone(input), error: e.name, after: item() });
        throw e;
      }
    };
    db.updateItem = recorded(db.updateItem.bind(db));
    db.deleteItem = recorded(db.deleteItem.bind(db));
    return db;
  }

  public lockItem(w: World): Item | undefined {
    const items = Object.values(w.tables[this.s.tableName]);
    return items.find((i) => 'S' in (i[LOCK_KEY] ?? {}) && (i[LOCK_KEY] as { S: string }).S === this.s.lockName);
  }

  /** A copy of the world with `op` applied, then the bookkeeping every step needs. */
  private mutate(world: World, label: string, op: (w: World) => unknown): Step {
    const w = clone(world);
    op(w);
    this.afterStep(w, label);
    const time =
      w.budget.timeouts < world.budget.timeouts ||
      w.budget.sweeps < world.budget.sweeps ||
      w.budget.backstops < world.budget.backstops ||
      w.budget.ticks < world.budget.ticks;
    return { label, world: w, time };
  }

  /** Whether an execution is in the user's body itself (with body slots: inside "Run Body In Slot"). */
  private inUserBody(e: Exec): boolean {
    if (e.status !== 'RUNNING' || !e.root) return false;
    return this.info(e).machine.leaves(e.root).some((l) => l.thread.state === BODY_TASK);
  }

  /**
   * With a rate alone: whether the execution must hold a permit for the rate. Its branch beside the body
   * has not given the permit back yet (at its Prepare or Wait; or its body failed before it did, until the
   * failure path's Wait has passed), or a redriven run whose body started
   * again in a run after its branch began holds it while the body runs and for the interval after it. A redriven run is
   * let off until its guard has finished or it holds a permit (it runs without one until then: see the
   * README).
   */
  private holdsForRate(e: Exec): boolean {
    if (e.machine !== 'workflow' || e.status !== 'RUNNING' || !e.root) return false;
    if (e.run > 0 && e.protectedRun !== e.run) return false;
    const bodyStartedAfterHold = e.run > 0 && e.bodyRun === e.run && (e.holdRun ?? 0) !== e.run;
    return this.info(e)
      .machine.leaves(e.root)
      .some(
        (l) =>
          l.thread.state === STATE.prepareReleaseAtInterval ||
          l.thread.state === STATE.holdForRate ||
          (e.holdOwed === true && (l.thread.state === STATE.checkPermitAfterFailure || l.thread.state === STATE.holdAfterFailure)) ||
          ((l.thread.state === STATE.holdAfterRedrive || l.thread.state === BODY_TASK) && bodyStartedAfterHold),
      );
  }

  private inBody(e: Exec): boolean {
    if (e.status !== 'RUNNING' || !e.root) return false;
    return this.info(e).machine.leaves(e.root).some((l) => this.s.workflow.machine.isInside(STATE.runBody, l.thread.state));
  }

  /** Track body entries and exits; check fencing tokens at entry. Violations are found by `violations`. */
  private afterStep(w: World, _label: string | undefined): void {
    // Without stale reads left, only what DescribeExecution says now matters.
    if (w.budget.staleReads === 0) for (const e of w.execs) if (e.views.length > 1) e.views = [e.views[e.views.length - 1]];
    for (const e of w.execs) {
      if (e.machine !== 'workflow') continue;
      const now = this.inBody(e);
      if (now && !e.inBody && e.guarded !== false) {
        e.guarded = true;
        const leaf = this.info(e).machine.leaves(e.root!).find((l) => l.thread.state === BODY_TASK);
        const token = (leaf?.thread.input as any)?.permit?.fencingToken;
        // Fencing tokens order the bodies: with body slots, the slot's take draws them.
        if ((this.s.bodyLimit ?? this.s.limit) === 1 && typeof token === 'number') {
          if (w.ghost.lastFence !== undefined && token <= w.ghost.lastFence) w.ghost.fenceViolation = `${e.name} entered the body with fencing token ${token}, not above ${w.ghost.lastFence}`;
          w.ghost.lastFence = token;
        }
      }
      if (this.s.releaseAtInterval && e.run > 0 && e.protectedRun !== e.run && this.ownEntry(w, e)) e.protectedRun = e.run;
      if (!now) e.guarded = undefined;
      else if (e.guarded === false && this.ownEntry(w, e)) e.guarded = true;
      e.inBody = now;
    }
  }

  private ownEntry(w: World, e: Exec): boolean {
    const entry = this.lockItem(w)?.[holderKey(e)];
    if (!entry || !('M' in entry) || !entry.M[HOLDER_ACQUIRED_AT]) return false;
    const run = entry.M[HOLDER_REDRIVE_COUNT];
    return (run && 'N' in run ? Number(run.N) : 0) === e.run;
  }

  /** What does not hold in this world (empty: all is well). */
  public violations(w: World): string[] {
    const result: string[] = [];
    const item = this.lockItem(w);
    const limit = this.s.limit;
    if (item) {
      const holders = Object.entries(item).filter(([, v]) => 'M' in v && v.M[HOLDER_ACQUIRED_AT] !== undefined);
      const permits = item[PERMITS_IN_USE] && 'N' in item[PERMITS_IN_USE] ? Number((item[PERMITS_IN_USE] as { N: string }).N) : 0;
      // Each entry holds one permit, or a weighted entry its `permits` (and `extra`, one less), or an entry of a body slot none.
      const held = holders.reduce((n, [, v]) => n + weightOf(v), 0);
      if (permits !== held) result.push(`permitsInUse is ${permits} but ${holders.length} holders have entries holding ${held}`);
      for (const [holder, v] of holders) {
        const m = (v as { M: Record<string, AttributeValue> }).M;
        const extra = m[HOLDER_EXTRA_PERMITS];
        // (An entry of no permit keeps a body slot, its permit gone back at the rate's interval; or, for a
        // moment after a failed body gave its slot back, nothing, until its failure path removes it.)
        const slotOnly = weightOf(v) === 0 && extra === undefined;
        if (m[HOLDER_PERMITS] !== undefined && !slotOnly && !(extra && 'N' in extra && Number(extra.N) === weightOf(v) - 1)) {
          result.push(`the entry of ${holder} holds ${weightOf(v)} permits but records ${JSON.stringify(extra)} extra`);
        }
      }
      if (permits > limit) result.push(`permitsInUse is ${permits}, above the limit of ${limit}`);
      // The lock's collector mark counts the entries that carry one (RELEASE_UPDATE takes both off together).
      const collecting = item[COLLECTING] && 'N' in item[COLLECTING] ? Number((item[COLLECTING] as { N: string }).N) : 0;
      const marked = holders.filter(([, v]) => (v as { M: Record<string, AttributeValue> }).M[HOLDER_COLLECTING] !== undefined).length;
      if (collecting !== marked) result.push(`collecting is ${collecting} but ${marked} entries carry the collector's mark`);
    }
    // A rate alone: the permit goes back beside a body that may still run. Until then (the branch's
    // Prepare and Wait, whatever the body does) the execution must hold it: the interval after every
    // start of the body, redriven ones included, is what the rate counts.
    const inside = this.s.releaseAtInterval
      ? w.execs.filter((e) => this.holdsForRate(e))
      : w.execs.filter((e) => e.machine === 'workflow' && e.inBody && e.guarded);
    for (const e of inside) {
      if (!this.ownEntry(w, e)) result.push(`OwnEntry: ${e.name} is in the body (run ${e.run}) without an entry stamped with its run`);
    }
    const clients = w.actors.filter((a) => this.holding(w, a));
    for (const c of clients) {
      if (!item?.[c.args.leaseId]) result.push(`${c.id} holds its permit, but its lease entry is gone`);
    }
    // With body slots, the rate holds permits after the bodies end: the limit binds the bodies' slots.
    const bodyLimit = this.s.bodyLimit;
    const permitsInside = inside.length * this.s.permits + clients.length * (this.options.clientPermits ?? 1);
    if (bodyLimit === undefined && permitsInside > limit) {
      const who = [...inside.map((e) => e.name), ...clients.map((c) => c.id)].join(', ');
      result.push(`${inside.length + clients.length} inside at once (${who}) holding ${permitsInside} permits, limit ${limit}`);
    }
    if (bodyLimit !== undefined) {
      const working = w.execs.filter((e) => e.machine === 'workflow' && e.inBody && e.guarded && this.inUserBody(e));
      for (const e of working) {
        const entry = item?.[holderKey(e)];
        if (!(entry && 'M' in entry && entry.M[HOLDER_IN_BODY])) result.push(`BodySlot: ${e.name} runs its body (run ${e.run}) without a body slot`);
      }
      if (working.length + clients.length > bodyLimit) {
        const who = [...working.map((e) => e.name), ...clients.map((c) => c.id)].join(', ');
        result.push(`${working.length + clients.length} bodies at once (${who}), concurrency limit ${bodyLimit}`);
      }
      if (permitsInside > limit) result.push(`${inside.length + clients.length} hold permits inside, above the rate's count ${limit}`);
    }
    if (item) {
      const marked = Object.values(item).filter((v) => 'M' in v && v.M[HOLDER_ACQUIRED_AT] !== undefined && v.M[HOLDER_IN_BODY] !== undefined).length;
      const bodies = item[BODIES_RUNNING] && 'N' in item[BODIES_RUNNING] ? Number((item[BODIES_RUNNING] as { N: string }).N) : 0;
      if (bodies !== marked) result.push(`bodiesRunning is ${bodies} but ${marked} entries hold a body slot`);
      if (bodyLimit !== undefined && bodies > bodyLimit) result.push(`bodiesRunning is ${bodies}, above the concurrency limit of ${bodyLimit}`);
    }
    for (const [handoff, n] of Object.entries(w.ghost.wakes)) if (n > 1) result.push(`hand-off ${handoff} woke ${n} waiters`);
    // A request DynamoDB refuses as malformed (an unused or undefined name, an invalid path), or a
    // runtime error, ends an execution only when a definition is broken: no fault of the model leads there.
    for (const e of w.execs) {
      if (e.status === 'FAILED' && e.error !== undefined && BROKEN_DEFINITION_ERRORS.test(e.error)) result.push(`${e.name} failed with ${e.error}: a broken definition`);
      // The release beside the body (a rate alone) ends its branch when a call fails: the body runs on.
      if (e.status === 'FAILED' && e.throttledIn?.endsWith(RELEASE_AT_INTERVAL_SUFFIX) && /ProvisionedThroughputExceeded/.test(e.error ?? '')) {
        result.push(`${e.name} failed: its release beside the body, throttled past its retries in '${e.throttledIn}', stopped the body`);
      }
    }
    if (w.ghost.fenceViolation) result.push(`fencing: ${w.ghost.fenceViolation}`);
    return result;
  }

  /** Whether a step was a fault: it used some of the budget of faults. */
  public isFault(before: World, after: World): boolean {
    const a = before.budget;
    const b = after.budget;
    return (
      b.stops < a.stops ||
      b.inFlight < a.inFlight ||
      b.redrives < a.redrives ||
      b.serverErrors < a.serverErrors ||
      b.exhaustedRetries < a.exhaustedRetries ||
      b.lostWakeUps < a.lostWakeUps ||
      b.failedWakeUps < a.failedWakeUps ||
      b.lostEvents < a.lostEvents ||
      b.duplicateEvents < a.duplicateEvents ||
      b.staleReads < a.staleReads ||
      b.bodyFailures < a.bodyFailures
    );
  }

  /** The world with no faults left to happen, and time free to pass (for the fair run). */
  public fairCopy(w: World): World {
    const copy = clone(w);
    copy.budget = { ...FAIR_BUDGET };
    copy.fair = true;
    return copy;
  }

  /** Nothing runs any more: no execution, event, late write, reconciler run or client. */
  public quiescent(w: World): boolean {
    return w.execs.every((e) => e.status !== 'RUNNING') && w.events.length === 0 && w.late.length === 0 && w.actors.length === 0;
  }

  /** After everything ended and a last sweep: a permit still held, or undefined. */
  public leftovers(w: World): string | undefined {
    const item = this.lockItem(w);
    if (!item) return undefined;
    const holders = Object.entries(item).filter(([, v]) => 'M' in v && v.M[HOLDER_ACQUIRED_AT] !== undefined).map(([k]) => shortName(k));
    const permits = item[PERMITS_IN_USE] && 'N' in item[PERMITS_IN_USE] ? Number((item[PERMITS_IN_USE] as { N: string }).N) : 0;
    if (holders.length || permits) return `a permit is held for good after every execution ended and the reconciler swept: ${permits} in use, holders ${holders.join(', ') || 'none'}`;
    return undefined;
  }

  /**
   * The text of a world, for the search's set of states seen: equal worlds give equal text. The
   * items' attributes are sorted (their order depends on the order of writes); the rest of the world
   * is built in one order by this code, so plain JSON is enough (and a difference would only cost a
   * duplicate state, never a missed one).
   */
  public key(w: World): string {
    return `${this.keyParts(w)}|${JSON.stringify(w.budget)}|${w.fair === true}`;
  }

  /** The key of `fairCopy(w)`, without making the copy. */
  public fairKey(w: World): string {
    return `${this.keyParts(w)}|${FAIR_BUDGET_TEXT}|true`;
  }

  /** The window of ticket numbers a world names (see canonicalTickets). */
  private ticketSpan(w: World): number {
    this.keyParts(w);
    return this.spanCache.get(w)!;
  }

  /** Everything of a world's key but its budget (cached: a world is keyed as a successor, then for its fair run). */
  private keyParts(w: World): string {
    let parts = this.partsCache.get(w);
    if (parts !== undefined) return parts;
    // A wait's count of history events (`semaphoreWait.events`) only grows: past WAIT_EVENTS_CAP it is
    // keyed as the cap, so that a loop that waits and looks again (a collector short of permits) does
    // not make a new world of every round. No configuration comes near the wait's budget of events.
    // The same for the retries of the wait for a body slot (a Parallel retried every round, up to about
    // 220 rounds): past SLOT_ROUNDS_CAP they are keyed as the cap.
    const texts = w.execs.map((e) =>
      (this.slotWaits ? JSON.stringify(e, capSlotRounds) : JSON.stringify({ ...e, seq: undefined })).replace(
        WAIT_EVENTS_COUNT,
        (_m, n: string) => `"semaphoreWait":{"events":${Math.min(Number(n), WAIT_EVENTS_CAP)}}`,
      ),
    );
    const rename = this.symmetry(w, texts);
    const r = rename ?? ((t: string) => t);
    const sorted = (list: string[]) => list.sort().join(',');
    parts = [
      stableStringify(w.tables, rename),
      sorted(texts.map(r)),
      sorted(w.actors.map((a) => r(JSON.stringify(a)))),
      sorted(w.late.map((l) => r(JSON.stringify(l)))),
      sorted(w.events.map((e) => r(JSON.stringify(e)))),
      w.clock,
      stableStringify(w.ghost, rename),
    ].join('|');
    const canonical = canonicalTickets(canonicalSequence(parts));
    parts = canonical.text;
    this.spanCache.set(w, canonical.span);
    this.partsCache.set(w, parts);
    return parts;
  }

  /**
   * The workflow's executions start alike (same input, same time), so a world and the world with
   * their names swapped behave alike: the key is that of one representative, the world with the
   * executions renamed in the order of their states (symmetry reduction). The executions' names occur
   * in ARNs, tokens, ids and the names of their cleanups and guards. Undefined: no renaming needed.
   */
  private symmetry(w: World, texts: string[]): ((s: string) => string) | undefined {
    const workflow = w.execs.map((e, i) => ({ e, text: texts[i] })).filter(({ e }) => e.machine === 'workflow');
    if (workflow.length < 2) return undefined;
    const masked = workflow.map(({ e, text }) => ({ name: e.name, sig: text.replace(NAME_PATTERN, (_m, prefix: string) => `${prefix}?`) }));
    const names = masked.map((m) => m.name).sort();
    masked.sort((a, b) => (a.sig < b.sig ? -1 : a.sig > b.sig ? 1 : 0));
    const map = new Map(masked.map((m, i) => [m.name, names[i]]));
    if ([...map].every(([from, to]) => from === to)) return undefined;
    return (t: string) => t.replace(NAME_PATTERN, (_m, prefix: string, name: string) => `${prefix}${map.get(name) ?? name}`);
  }

  /** Where every execution is, and what is pending: for traces. */
  public describeWorld(w: World): string {
    const execs = w.execs.map((e) => {
      const at = e.root ? this.info(e).machine.leaves(e.root).map((l) => `${l.thread.state}${l.thread.token ? ' (waiting)' : ''}`).join(' + ') : '';
      return `${e.name} ${e.status} run ${e.run}${at ? ` at ${at}` : ''}`;
    });
    const events = w.events.map((e) => `${e.kind} ${shortName(e.arn)} ${e.status} ${e.run}`);
    return [`executions: ${execs.join('; ')}`, `events: ${events.join('; ') || 'none'}`, `late writes: ${w.late.length}`, `actors: ${w.actors.map((a) => a.id).join(', ') || 'none'}`].join('\n');
  }

  /** A short summary of the lock item, for traces. */
  public describeLock(w: World): string {
    const item = this.lockItem(w);
    if (!item) return 'no lock item';
    const parts: string[] = [];
    for (const [name, value] of Object.entries(item)) {
      if (name === LOCK_KEY) continue;
      parts.push(`${shortName(name)}=${summarize(value)}`);
    }
    return parts.sort().join(' ');
  }
}

/** The fair run's budget: no faults, and time that passes as often as needed. */
const FAIR_BUDGET: Budget = { ...NO_FAULTS, timeouts: 1_000, sweeps: 1_000, ticks: 1_000 };
const FAIR_BUDGET_TEXT = JSON.stringify(FAIR_BUDGET);

/**
 * Where a workflow execution's one-letter name occurs: its ARN, its holder id, its tokens and ids, its cleanups and guards, its
 * name; at the end of a string too (a table's key or value, which stableStringify renames on its own).
 */
const NAME_PATTERN = /(:execution:wf:|\b[0-9a-f]{32}:|\btok:|\buuid:|\bcleanup-|\bguard-|"name":")([A-Z])(?=[:"-]|$)/g;

/** A wait's count of history events in an execution's JSON, and the value above which it is keyed as one. */
const WAIT_EVENTS_COUNT = /"semaphoreWait":\{"events":(\d+)\}/g;
const WAIT_EVENTS_CAP = 200;

/** Rounds of the wait for a body slot above which a thread is keyed as this many (see keyParts). */
const SLOT_ROUNDS_CAP = 3;

/** A JSON.stringify replacer for an execution: the retries of a "Wait For Body Slot" thread, capped at SLOT_ROUNDS_CAP; its counter `seq` left out. */
function capSlotRounds(this: unknown, key: string, value: unknown): unknown {
  // An execution's counter of tokens and UUIDs: only freshness matters (see canonicalSequence).
  if (key === 'seq' && typeof value === 'number' && (this as Partial<Exec> | undefined)?.machine !== undefined) return undefined;
  const thread = value as Thread | undefined;
  if (thread?.state !== STATE.waitForBodySlot || thread.attempts === undefined) return value;
  const attempts: Record<string, number> = {};
  for (const [k, n] of Object.entries(thread.attempts)) attempts[k] = Math.min(n, SLOT_ROUNDS_CAP);
  return { ...thread, attempts };
}

/** Errors no fault of the model explains: a malformed request, or a runtime error of the interpreter. */
const BROKEN_DEFINITION_ERRORS = /AmazonDynamoDBException|ValidationException|^States\.(Runtime|DataLimitExceeded)$/;

function iso(clock: number): string {
  return new Date(BASE_TIME + clock * TICK_MS).toISOString();
}

function sortEvents(w: World): void {
  w.events.sort((a, b) => stableStringify(a).localeCompare(stableStringify(b)));
}

function sortLate(w: World): void {
  w.late.sort((a, b) => stableStringify(a).localeCompare(stableStringify(b)));
}

/** The execution name at the end of an ARN or a holder id, or the text itself. */
export function shortName(arnOrName: string): string {
  const m = /:execution:[^:]+:(.+)$/.exec(arnOrName) ?? /^[0-9a-f]{32}:([^:]+)$/.exec(arnOrName);
  if (m) return m[1];
  return arnOrName.replace(/arn:aws:states:[^:]*:\d*:execution:[^:]+:/g, '');
}

function summarize(value: AttributeValue): string {
  if ('S' in value) return value.S.length > 24 ? `${value.S.slice(0, 24)}…` : value.S;
  if ('N' in value) return value.N;
  if ('BOOL' in value) return String(value.BOOL);
  if ('L' in value) return `[${value.L.map(summarize).join(',')}]`;
  if ('M' in value) return `{${Object.entries(value.M).map(([k, v]) => `${k}:${summarize(v)}`).join(',')}}`;
  return 'null';
}

function describeRequest(input: Record<string, any>): string {
  const names = input.ExpressionAttributeNames ?? {};
  const holder = names['#holder'] ? ` ${shortName(names['#holder'])}` : '';
  return `${input.ConditionExpression ? `[${input.ConditionExpression.slice(0, 60)}${input.ConditionExpression.length > 60 ? '…' : ''}]` : ''}${holder}`;
}

function marshallRequest(input: Record<string, any>): Record<string, any> {
  const out: Record<string, any> = { ...input };
  for (const k of ['Key', 'ExclusiveStartKey', 'Item']) if (out[k] !== undefined) out[k] = marshall(out[k]);
  if (out.ExpressionAttributeValues) out.ExpressionAttributeValues = marshall(out.ExpressionAttributeValues);
  for (const k of Object.keys(out)) if (out[k] === undefined) delete out[k];
  return out;
}

function unmarshallResponse(output: Record<string, any>): Record<string, any> {
  const out: Record<string, any> = { ...output };
  if (out.Item) out.Item = unmarshall(out.Item);
  if (out.Items) out.Items = out.Items.map((i: Item) => unmarshall(i as any));
  if (out.Attributes) out.Attributes = unmarshall(out.Attributes);
  return out;
}

/** How many permits a holder entry holds: its `permits`, or one. */
function weightOf(entry: AttributeValue): number {
  const permits = 'M' in entry ? entry.M[HOLDER_PERMITS] : undefined;
  return permits && 'N' in permits ? Number(permits.N) : 1;
}

/** An execution's holder id in the lock item. */
function holderKey(e: Exec): string {
  return executionHolderKeyOfArn(e.arn)!;
}
