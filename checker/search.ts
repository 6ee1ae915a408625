import { createHash } from 'crypto';
import { Model, Step, World } from './model';

/*
 * Breadth-first search of every interleaving the model allows: the first violation found is one of
 * the shortest, and its trace is printed step by step with the lock item after each.
 *
 * Liveness ("under fairness, no permit is held forever by an ended execution, and every execution
 * ends") is checked from every state the search reaches: with no more faults, a fair scheduler runs
 * every execution, event, late write and reconciler run to the end, lets time pass, sweeps, and then
 * no permit may be held and no execution may still run. A state whose fair run was verified marks
 * every state on that run verified, so most runs stop after a few steps.
 */

export interface TraceStep {
  readonly label: string;
  readonly lock: string;
}

export interface Counterexample {
  readonly violation: string;
  /** From the first step to the one that broke the invariant. */
  readonly trace: TraceStep[];
  /** For a liveness violation: the fair run after the trace, that never got there. */
  readonly fairRun?: TraceStep[];
}

export interface SearchResult {
  readonly states: number;
  readonly transitions: number;
  readonly maxDepth: number;
  readonly seconds: number;
  /** States from which the fair run was checked (liveness). */
  readonly fairRuns: number;
  readonly counterexample?: Counterexample;
  /** The search stopped at `maxStates` before it was done. */
  readonly incomplete: boolean;
  /** The search stopped at its `bound`, by design: every state of at most `maxDepth` steps was checked. */
  readonly bounded: boolean;
}

export interface SearchOptions {
  /** Stop after this many states (the result says so). @default 5,000,000 */
  readonly maxStates?: number;
  /**
   * Stop once this many states were found, as a bounded search that passes (the test command's): every
   * interleaving of up to `maxDepth` steps was checked, liveness only by the fair runs started on
   * the way (a loop without waits is judged only when a search is done). @default no bound
   */
  readonly bound?: number;
  /** Check liveness too. @default true */
  readonly liveness?: boolean;
  /** Called every 100,000 states. */
  readonly progress?: (states: number, depth: number) => void;
}

interface Visit {
  readonly parent?: string;
  readonly label: string;
  readonly depth: number;
}

function hash(text: string): string {
  return createHash('sha1').update(text).digest('base64').slice(0, 16);
}

export function search(model: Model, options: SearchOptions = {}): SearchResult {
  const started = Date.now();
  const maxStates = options.maxStates ?? 5_000_000;
  const initial = model.initial();
  const visited = new Map<string, Visit>();
  const live = new Set<string>();
  /** Liveness still to resolve: a state's fair run continues as the fair run of `next` (see below). */
  const chain = new Map<string, { next: string; state: string }>();
  let fairRuns = 0;
  const rootHash = hash(model.key(initial));
  visited.set(rootHash, { label: 'start', depth: 0 });
  let queue: Array<{ world: World; hash: string }> = [{ world: initial, hash: rootHash }];
  let next: Array<{ world: World; hash: string }> = [];
  let transitions = 0;
  let depth = 0;

  const bound = options.bound ?? Infinity;
  const finish = (counterexample?: Counterexample, stopped?: 'incomplete' | 'bounded'): SearchResult => ({
    states: visited.size,
    transitions,
    maxDepth: depth,
    seconds: (Date.now() - started) / 1000,
    fairRuns,
    counterexample,
    incomplete: stopped === 'incomplete',
    // (Stopped early, it was adding the states one step past `depth`: every state up to `depth` was checked.)
    bounded: stopped === 'bounded',
  });
  const trace = (h: string): string[] => {
    const labels: string[] = [];
    for (let v = visited.get(h); v && v.parent !== undefined; v = visited.get(v.parent)) labels.push(v.label);
    return labels.reverse();
  };

  const initialViolations = model.violations(initial);
  if (initialViolations.length) return finish({ violation: initialViolations[0], trace: [] });

  while (queue.length > 0) {
    for (const { world, hash: h } of queue) {
      const successors = model.successors(world);
      if (options.liveness !== false) {
        // The fair run's first step is the first step that is neither a fault nor time passing. That
        // step leads to a state the search reaches too, so this state's fair run is that state's: a
        // chain, resolved when the search is done. Only where time must pass does a fair run start here.
        const fk = hash(model.fairKey(world));
        const first = successors.find((s) => !s.time && !model.isFault(world, s.world));
        if (live.has(fk)) {
          // known
        } else if (first !== undefined) {
          chain.set(fk, { next: hash(model.fairKey(first.world)), state: h });
        } else {
          const stuck = fairRun(model, world, live);
          fairRuns++;
          if (stuck) return finish({ violation: stuck.violation, trace: replay(model, trace(h)), fairRun: stuck.run });
        }
      }
      for (const step of successors) {
        transitions++;
        const key = model.key(step.world);
        const sh = hash(key);
        if (visited.has(sh)) continue;
        visited.set(sh, { parent: h, label: step.label, depth: depth + 1 });
        const broken = model.violations(step.world);
        if (broken.length) return finish({ violation: broken[0], trace: replay(model, trace(sh)) });
        next.push({ world: step.world, hash: sh });
        if (visited.size % 100_000 === 0) options.progress?.(visited.size, depth + 1);
        if (visited.size >= maxStates) return finish(undefined, 'incomplete');
        if (visited.size >= bound) return finish(undefined, 'bounded');
      }
    }
    queue = next;
    next = [];
    if (queue.length) depth++;
  }
  // Liveness: every chain of first fair steps must end at a state whose fair run ended well.
  for (const [start] of chain) {
    const path: string[] = [];
    const onPath = new Set<string>();
    let k = start;
    while (!live.has(k)) {
      const link = chain.get(k);
      if (!link || onPath.has(k)) {
        // A state whose fair run was not made (a cycle of steps in which time never passes): make it.
        const at = chain.get(k) ?? chain.get(path[path.length - 1])!;
        const world = replayWorld(model, trace(at.state));
        const stuck = fairRun(model, world, live);
        fairRuns++;
        if (stuck) return finish({ violation: stuck.violation, trace: replay(model, trace(at.state)), fairRun: stuck.run });
        if (!live.has(k)) live.add(k);
        break;
      }
      path.push(k);
      onPath.add(k);
      k = link.next;
    }
    for (const p of path) live.add(p);
  }
  return finish();
}

/** The world a trace leads to. */
function replayWorld(model: Model, labels: string[]): World {
  let world = model.initial();
  for (const label of labels) world = model.successors(world).find((s) => s.label === label)!.world;
  return world;
}

/** The steps of a trace again, from the start, with the lock after each. */
export function replay(model: Model, labels: string[]): TraceStep[] {
  let world = model.initial();
  const steps: TraceStep[] = [];
  for (const label of labels) {
    const step = model.successors(world).find((s) => s.label === label);
    if (!step) throw new Error(`cannot replay the step '${label}'`);
    world = step.world;
    steps.push({ label, lock: model.describeLock(world) });
  }
  return steps;
}

/** Steps that only the passing of time brings: a Wait state's end, a callback wait timing out, a scheduled sweep, a tick. */
const TIME_STEPS = [' waits', ' times out', 'the reconciler sweeps', 'time passes'];

/**
 * The fair run from a world: no more faults; every other step is taken in turn (late writes land),
 * and when only time can bring progress, a wait times out, the reconciler sweeps and time passes, in
 * rotation. Once nothing runs any more, time passes and a last sweep runs: then no permit may be held.
 * Undefined if all is well; else what went wrong, and the run.
 */
function fairRun(model: Model, start: World, live: Set<string>): { violation: string; run: TraceStep[] } | undefined {
  const stuck = fairRunLabels(model, start, live);
  if (!stuck) return undefined;
  // Again, for the trace: the lock after each step.
  let world = model.fairCopy(start);
  const run = stuck.labels.map((label) => {
    world = model.successors(world).find((s) => s.label === label)!.world;
    return { label, lock: model.describeLock(world) };
  });
  return { violation: stuck.violation, run: run.slice(-40) };
}

function fairRunLabels(model: Model, start: World, live: Set<string>): { violation: string; labels: string[] } | undefined {
  let world = model.fairCopy(start);
  const seen: string[] = [];
  let turn = 0;
  let finalSweep = false;
  // Round robin: the step of whoever (an execution, an event, a reconciler run) waited longest.
  const served = new Map<string, number>();
  const who = (label: string) => label.split(':')[0];
  const labels: string[] = [];
  const take = (step: Step) => {
    labels.push(step.label);
    world = step.world;
    return model.violations(world);
  };
  for (let i = 0; ; i++) {
    if (i === 2_000) {
      return { violation: `the fair run did not end within 2,000 steps: an execution never finishes\n${model.describeWorld(world)}`, labels };
    }
    const h = hash(model.fairKey(world));
    if (live.has(h)) break;
    seen.push(h);
    // The fair copy has no faults left: every step is either progress or the passing of time.
    const steps = model.successors(world);
    const progress = steps.filter((s) => !s.time);
    progress.sort((a, b) => (served.get(who(a.label)) ?? -1) - (served.get(who(b.label)) ?? -1));
    let step: Step | undefined = progress[0];
    if (step) served.set(who(step.label), i);
    if (!step && model.quiescent(world)) {
      if (finalSweep) {
        const left = model.leftovers(world);
        if (left) return { violation: left, labels };
        break;
      }
      // Everything has ended: time passes, and the reconciler's last sweep runs.
      finalSweep = true;
      const broken = take(steps.find((s) => s.label === 'time passes')!);
      if (broken.length) return { violation: `in the fair run: ${broken[0]}`, labels };
      step = model.successors(world).find((s) => s.label === 'the reconciler sweeps')!;
    }
    for (let k = 0; !step && k < TIME_STEPS.length; k++) {
      const kind = TIME_STEPS[(turn + k) % TIME_STEPS.length];
      // Of that kind, whoever waited longest: one execution's Wait must not always go before another's
      // (a poller's wait, again and again, before the Wait of the holder it waits for).
      const due = steps.filter((s) => s.label.includes(kind));
      due.sort((a, b) => (served.get(who(a.label)) ?? -1) - (served.get(who(b.label)) ?? -1));
      step = due[0];
      if (step) {
        turn = (turn + k + 1) % TIME_STEPS.length;
        served.set(who(step.label), i);
      }
    }
    if (!step) return { violation: `the fair run is stuck: nothing can happen, yet not everything has ended\n${model.describeWorld(world)}`, labels };
    const broken = take(step);
    if (broken.length) return { violation: `in the fair run: ${broken[0]}`, labels };
  }
  for (const h of seen) live.add(h);
  return undefined;
}
