/*
 * A small-step interpreter of Amazon States Language (JSONPath), for the protocol checker. It runs the
 * very definitions the constructs synthesize, one visible step at a time: a Task (a DynamoDB write, a
 * SendTaskSuccess, the user's body) or a Wait is a step of its own; Pass, Choice, Succeed, Fail and the
 * entry and exit of a Parallel are folded into the step before them, since nothing else can see them.
 *
 * The state of an execution is plain JSON (a tree of threads: one per Parallel branch), so that the
 * checker can copy, compare and hash it. Redrive resumes that tree: the threads stay where they were,
 * and the task each was at runs again.
 *
 * What it does not know it refuses: JSONata, Map, unknown intrinsics or Choice operators. It never
 * guesses.
 */

import { createHash } from 'crypto';

/** A thread: where one branch of an execution is, and with what input. */
export interface Thread {
  /** The state it is at (state names are unique across a state machine, nested branches included). */
  state: string;
  /** The state's raw input. */
  input: unknown;
  /** `$$.State.EnteredTime`. */
  enteredAt: string;
  /** Retries used, by retrier index. */
  attempts?: Record<string, number>;
  /** A `.waitForTaskToken` task whose call was made: the token it waits on. */
  token?: string;
  /** A Parallel state's branches: running, or ended. */
  branches?: Array<Thread | BranchEnd>;
}

export type BranchEnd = { end: 'ok'; output: unknown } | { end: 'fail'; error: string; cause: string };

export function isEnd(t: Thread | BranchEnd): t is BranchEnd {
  return (t as BranchEnd).end !== undefined;
}

/** What an execution's context object holds, besides the state and the task. */
export interface ExecutionContext {
  readonly id: string;
  readonly name: string;
  readonly input: unknown;
  readonly redriveCount: number;
  readonly startTime: string;
  readonly stateMachineId: string;
}

/** What the interpreter needs from outside: the time, fresh ids, and who learns of abandoned threads. */
export interface AslHost {
  readonly execution: ExecutionContext;
  /** `$$.State.EnteredTime` of states entered now. */
  now(): string;
  /** `States.UUID()`. */
  uuid(): string;
  /** A state was entered (the history's StateEntered event). */
  entered?(name: string): void;
  /** A running thread was abandoned (its Parallel failed): its task, if it made a call, may still land. */
  onAbandon(thread: Thread): void;
}

/** An error the definition raised, or that a task raised, as Retry and Catch match it. */
export class StatesError extends Error {
  constructor(
    name: string,
    message: string,
  ) {
    super(message);
    this.name = name;
  }
}

/** A leaf thread (at a Task or a Wait) and the branch indexes that lead to it from the root. */
export interface Leaf {
  readonly path: number[];
  readonly thread: Thread;
}

export class AslMachine {
  private readonly states = new Map<string, any>();

  constructor(public readonly definition: any) {
    if (definition.QueryLanguage === 'JSONata') throw new Error('the checker runs JSONPath definitions only (JSONata found at the top level)');
    this.index(definition);
  }

  private index(scope: any): void {
    for (const [name, state] of Object.entries<any>(scope.States)) {
      if (this.states.has(name)) throw new Error(`state name '${name}' appears twice`);
      if (state.QueryLanguage === 'JSONata') throw new Error(`state '${name}' is JSONata: the checker runs JSONPath only`);
      if (!['Task', 'Pass', 'Choice', 'Wait', 'Succeed', 'Fail', 'Parallel'].includes(state.Type)) {
        throw new Error(`state '${name}' is a ${state.Type}: the checker has no model of it`);
      }
      this.states.set(name, state);
      for (const branch of state.Branches ?? []) this.index(branch);
    }
  }

  /** The definition of a state. */
  public state(name: string): any {
    const state = this.states.get(name);
    if (!state) throw new Error(`no state '${name}'`);
    return state;
  }

  /** Whether a state is one of the states of a Parallel's branches (at any depth). */
  public isInside(parallel: string, stateName: string): boolean {
    const walk = (scope: any): boolean =>
      Object.entries<any>(scope.States).some(([n, s]) => n === stateName || (s.Branches ?? []).some(walk));
    return (this.state(parallel).Branches ?? []).some(walk);
  }

  /** Start an execution: its root thread, settled at its first visible state, or its end. */
  public start(input: unknown, host: AslHost): Thread | BranchEnd {
    return this.enter(this.definition.StartAt, input, host);
  }

  /** The threads at a Task or a Wait, with their paths. */
  public leaves(root: Thread): Leaf[] {
    const result: Leaf[] = [];
    const walk = (thread: Thread, path: number[]) => {
      if (thread.branches) {
        thread.branches.forEach((b, i) => {
          if (!isEnd(b)) walk(b, [...path, i]);
        });
      } else {
        result.push({ path, thread });
      }
    };
    walk(root, []);
    return result;
  }

  /** The effective input of the task a thread is at (InputPath, then Parameters). */
  public taskInput(thread: Thread, host: AslHost, token?: string): unknown {
    const state = this.state(thread.state);
    const input = this.select(state.InputPath, thread.input, thread, host, token);
    return state.Parameters === undefined ? input : this.payload(state.Parameters, input, thread, host, token);
  }

  /** The task at `path` succeeded with `result`. Returns the new root (or the execution's end). */
  public succeed(root: Thread, path: number[], result: unknown, host: AslHost): Thread | BranchEnd {
    return this.at(root, path, host, (thread) => {
      const state = this.state(thread.state);
      return this.guard(thread, host, () => {
        const selected = state.ResultSelector === undefined ? result : this.payload(state.ResultSelector, result, thread, host);
        const output = this.select(state.OutputPath, this.applyResultPath(state.ResultPath, thread.input, selected), thread, host);
        return this.transition(state, output, host);
      });
    });
  }

  /** The task at `path` failed. Its Retry and Catch decide (its Catch alone once its retries are used up). */
  public fail(
    root: Thread,
    path: number[],
    error: string,
    cause: string,
    host: AslHost,
    options: { retriesExhausted?: boolean } = {},
  ): Thread | BranchEnd {
    return this.at(root, path, host, (thread) => this.handleError(thread, error, cause, host, options.retriesExhausted));
  }

  /** The Wait at `path` is over. */
  public waitOver(root: Thread, path: number[], host: AslHost): Thread | BranchEnd {
    return this.at(root, path, host, (thread) => {
      const state = this.state(thread.state);
      return this.guard(thread, host, () => {
        const input = this.select(state.InputPath, thread.input, thread, host);
        return this.transition(state, this.select(state.OutputPath, input, thread, host), host);
      });
    });
  }

  /** Every running leaf of a tree (for a stop: their tokens close, their calls may still land). */
  public abandon(root: Thread, host: AslHost): void {
    for (const leaf of this.leaves(root)) host.onAbandon(leaf.thread);
  }

  // ---- internals ----

  /** Apply `op` to the thread at `path`, then let every Parallel on the way up react to its branch. */
  private at(thread: Thread, path: number[], host: AslHost, op: (t: Thread) => Thread | BranchEnd): Thread | BranchEnd {
    if (path.length === 0) return op(thread);
    const branches = thread.branches!;
    const child = branches[path[0]];
    if (isEnd(child)) throw new Error('no running thread at that path');
    branches[path[0]] = this.at(child, path.slice(1), host, op);
    return this.afterBranch(thread, host);
  }

  /** A Parallel whose branch changed: it fails with a failed branch, completes when all are done, or waits. */
  private afterBranch(thread: Thread, host: AslHost): Thread | BranchEnd {
    const branches = thread.branches!;
    const failed = branches.find((b) => isEnd(b) && b.end === 'fail') as { error: string; cause: string } | undefined;
    if (failed) {
      // The other branches stop; a call one of them made may still land.
      for (const b of branches) if (!isEnd(b)) this.abandon(b, host);
      thread.branches = undefined;
      return this.handleError(thread, failed.error, failed.cause, host);
    }
    if (branches.every(isEnd)) {
      const outputs = branches.map((b) => (b as { output: unknown }).output);
      thread.branches = undefined;
      const state = this.state(thread.state);
      return this.guard(thread, host, () => {
        const selected = state.ResultSelector === undefined ? outputs : this.payload(state.ResultSelector, outputs, thread, host);
        const output = this.select(state.OutputPath, this.applyResultPath(state.ResultPath, thread.input, selected), thread, host);
        return this.transition(state, output, host);
      });
    }
    return thread;
  }

  /** Run `body`; a States.Runtime error from evaluating paths fails the thread (no catcher takes it). */
  private guard(thread: Thread, host: AslHost, body: () => Thread | BranchEnd): Thread | BranchEnd {
    try {
      return body();
    } catch (e) {
      if (e instanceof StatesError) return this.handleError(thread, e.name, e.message, host);
      throw e;
    }
  }

  private transition(state: any, output: unknown, host: AslHost): Thread | BranchEnd {
    if (state.End || state.Next === undefined) return { end: 'ok', output };
    return this.enter(state.Next, output, host);
  }

  /** Enter a state and run every state that no one else can see, up to a Task, a Wait or the end. */
  private enter(name: string, input: unknown, host: AslHost): Thread | BranchEnd {
    const thread: Thread = { state: name, input, enteredAt: host.now() };
    host.entered?.(name);
    const state = this.state(name);
    return this.guard(thread, host, () => {
      switch (state.Type) {
        case 'Task':
        case 'Wait':
          return thread;
        case 'Pass': {
          const effective = this.select(state.InputPath, input, thread, host);
          let result = state.Result !== undefined ? state.Result : effective;
          if (state.Parameters !== undefined) result = this.payload(state.Parameters, effective, thread, host);
          return this.transition(state, this.select(state.OutputPath, this.applyResultPath(state.ResultPath, input, result), thread, host), host);
        }
        case 'Choice': {
          const effective = this.select(state.InputPath, input, thread, host);
          const rule = (state.Choices as any[]).find((r) => this.choice(r, effective, thread, host));
          const next = rule?.Next ?? state.Default;
          if (next === undefined) throw new StatesError('States.NoChoiceMatched', `no choice rule of '${name}' matched`);
          return this.enter(next, this.select(state.OutputPath, effective, thread, host), host);
        }
        case 'Succeed':
          return { end: 'ok', output: this.select(state.OutputPath, this.select(state.InputPath, input, thread, host), thread, host) };
        case 'Fail': {
          const error = state.ErrorPath !== undefined ? String(this.path(state.ErrorPath, input, thread, host)) : state.Error ?? 'States.Fail';
          const cause = state.CausePath !== undefined ? String(this.path(state.CausePath, input, thread, host)) : state.Cause ?? '';
          return { end: 'fail', error, cause };
        }
        case 'Parallel': {
          this.startBranches(thread, host);
          return this.afterBranch(thread, host);
        }
      }
      throw new Error(`unreachable: ${state.Type}`);
    });
  }

  private startBranches(thread: Thread, host: AslHost): void {
    const state = this.state(thread.state);
    const effective = this.select(state.InputPath, thread.input, thread, host);
    const input = state.Parameters === undefined ? effective : this.payload(state.Parameters, effective, thread, host);
    thread.branches = (state.Branches as any[]).map((b) => this.enter(b.StartAt, input, host));
  }

  private handleError(thread: Thread, error: string, cause: string, host: AslHost, retriesExhausted = false): Thread | BranchEnd {
    const state = this.state(thread.state);
    const retriers: any[] = retriesExhausted ? [] : state.Retry ?? [];
    const r = retriers.findIndex((retrier) => matches(retrier.ErrorEquals, error));
    if (r >= 0) {
      const used = thread.attempts?.[r] ?? 0;
      if (used < (retriers[r].MaxAttempts ?? 3)) {
        thread.attempts = { ...thread.attempts, [r]: used + 1 };
        thread.token = undefined;
        if (state.Type === 'Parallel') {
          this.startBranches(thread, host);
          return this.afterBranch(thread, host);
        }
        return thread;
      }
    }
    const catcher = (state.Catch ?? []).find((c: any) => matches(c.ErrorEquals, error));
    if (!catcher) return { end: 'fail', error, cause };
    const output = this.applyResultPath(catcher.ResultPath, thread.input, { Error: error, Cause: cause });
    return this.enter(catcher.Next, output, host);
  }

  private choice(rule: any, input: unknown, thread: Thread, host: AslHost): boolean {
    if (rule.And) return (rule.And as any[]).every((r) => this.choice(r, input, thread, host));
    if (rule.Or) return (rule.Or as any[]).some((r) => this.choice(r, input, thread, host));
    if (rule.Not) return !this.choice(rule.Not, input, thread, host);
    const present = lookup(rule.Variable, input, this.context(thread, host)).found;
    if (rule.IsPresent !== undefined) return present === rule.IsPresent;
    if (!present) {
      if (Object.keys(rule).some((k) => k.startsWith('Is'))) return false;
      throw new StatesError('States.Runtime', `Invalid path '${rule.Variable}': the choice state's variable was not found`);
    }
    const value = this.path(rule.Variable, input, thread, host);
    const operand = (key: string) => (key.endsWith('Path') ? this.path(rule[key], input, thread, host) : rule[key]);
    for (const key of Object.keys(rule)) {
      if (key === 'Variable' || key === 'Next') continue;
      const other = operand(key);
      const base = key.replace(/Path$/, '');
      switch (base) {
        case 'IsNull':
          return (value === null) === other;
        case 'IsNumeric':
          return (typeof value === 'number') === other;
        case 'IsString':
          return (typeof value === 'string') === other;
        case 'IsBoolean':
          return (typeof value === 'boolean') === other;
        case 'StringEquals':
          return typeof value === 'string' && value === other;
        case 'BooleanEquals':
          return typeof value === 'boolean' && value === other;
        case 'NumericEquals':
          return typeof value === 'number' && value === other;
        case 'NumericLessThan':
          return typeof value === 'number' && value < (other as number);
        case 'NumericLessThanEquals':
          return typeof value === 'number' && value <= (other as number);
        case 'NumericGreaterThan':
          return typeof value === 'number' && value > (other as number);
        case 'NumericGreaterThanEquals':
          return typeof value === 'number' && value >= (other as number);
        default:
          throw new Error(`the checker has no model of the choice operator ${key}`);
      }
    }
    throw new Error(`a choice rule without an operator: ${JSON.stringify(rule)}`);
  }

  private context(thread: Thread, host: AslHost, token?: string): unknown {
    const e = host.execution;
    return {
      Execution: { Id: e.id, Name: e.name, Input: e.input, RedriveCount: e.redriveCount, StartTime: e.startTime },
      State: { EnteredTime: thread.enteredAt, Name: thread.state, RetryCount: Object.values(thread.attempts ?? {}).reduce((a, b) => a + b, 0) },
      StateMachine: { Id: e.stateMachineId, Name: e.stateMachineId.split(':')[6] },
      ...(token !== undefined ? { Task: { Token: token } } : {}),
    };
  }

  private select(path: string | null | undefined, value: unknown, thread: Thread, host: AslHost, token?: string): unknown {
    if (path === undefined) return value;
    if (path === null) return {};
    return this.path(path, value, thread, host, token);
  }

  /** A JSONPath's value (`$...` on `value`, `$$...` on the context); a missing one is a States.Runtime error. */
  private path(path: string, value: unknown, thread: Thread, host: AslHost, token?: string): unknown {
    const found = lookup(path, value, this.context(thread, host, token));
    if (!found.found) throw new StatesError('States.Runtime', `The JSONPath '${path}' could not be found in the input`);
    return found.value;
  }

  private applyResultPath(resultPath: string | null | undefined, input: unknown, result: unknown): unknown {
    if (resultPath === null) return input;
    if (resultPath === undefined || resultPath === '$') return result;
    const segments = parsePath(resultPath).segments;
    const root = input !== null && typeof input === 'object' ? JSON.parse(JSON.stringify(input)) : {};
    let target = root;
    segments.forEach((s, i) => {
      if (s.t !== 'key') throw new Error(`the checker supports ResultPath of field names only, got ${resultPath}`);
      if (i === segments.length - 1) target[s.v] = result;
      else target = target[s.v] !== null && typeof target[s.v] === 'object' ? target[s.v] : (target[s.v] = {});
    });
    return root;
  }

  /** Parameters, ResultSelector: `"key.$"` fields are paths or intrinsic functions. */
  private payload(template: unknown, input: unknown, thread: Thread, host: AslHost, token?: string): unknown {
    if (Array.isArray(template)) return template.map((t) => this.payload(t, input, thread, host, token));
    if (template === null || typeof template !== 'object') return template;
    const result: Record<string, unknown> = {};
    for (const [key, value] of Object.entries(template as Record<string, unknown>)) {
      if (key.endsWith('.$')) {
        const expr = value as string;
        result[key.slice(0, -2)] = expr.startsWith('States.') ? this.intrinsic(expr, input, thread, host, token) : this.path(expr, input, thread, host, token);
      } else {
        result[key] = this.payload(value, input, thread, host, token);
      }
    }
    return result;
  }

  private intrinsic(expr: string, input: unknown, thread: Thread, host: AslHost, token?: string): unknown {
    const parsed = parseIntrinsic(expr);
    const evaluate = (node: IntrinsicNode): unknown => {
      if (node.t === 'literal') return node.v;
      if (node.t === 'path') return this.path(node.v, input, thread, host, token);
      const args = node.args.map(evaluate);
      switch (node.name) {
        case 'States.Format': {
          let i = 1;
          return String(args[0]).replace(/\{\}/g, () => {
            const a = args[i++];
            return typeof a === 'string' ? a : JSON.stringify(a);
          });
        }
        case 'States.StringToJson':
          return JSON.parse(args[0] as string);
        case 'States.JsonToString':
          return JSON.stringify(args[0]);
        case 'States.MathAdd':
          return (args[0] as number) + (args[1] as number);
        case 'States.MathRandom':
          // Time is abstract in the checker: any delay is as good as another.
          return args[0];
        case 'States.UUID':
          return host.uuid();
        case 'States.ArrayGetItem': {
          const array = args[0] as unknown[];
          if (!Array.isArray(array) || (args[1] as number) >= array.length) throw new StatesError('States.Runtime', `${expr}: index out of range`);
          return array[args[1] as number];
        }
        case 'States.Array':
          return args;
        case 'States.ArrayLength':
          return (args[0] as unknown[]).length;
        case 'States.StringSplit': {
          // Only what the definitions use: one splitting character, no empty pieces (how AWS treats
          // several characters and empty pieces is not what the simulator does: refuse rather than guess).
          const pieces = String(args[0]).split(String(args[1]));
          if (String(args[1]).length !== 1 || pieces.includes('')) throw new Error(`the checker has no model of ${expr} on ${JSON.stringify(args)}`);
          return pieces;
        }
        case 'States.Hash': {
          const algorithm = ({ 'MD5': 'md5', 'SHA-1': 'sha1', 'SHA-256': 'sha256', 'SHA-384': 'sha384', 'SHA-512': 'sha512' } as Record<string, string>)[String(args[1])];
          if (!algorithm) throw new StatesError('States.Runtime', `${expr}: unknown hash algorithm ${String(args[1])}`);
          return createHash(algorithm).update(String(args[0]), 'utf8').digest('hex');
        }
        default:
          throw new Error(`the checker has no model of the intrinsic function ${node.name}`);
      }
    };
    return evaluate(parsed);
  }
}

/** Whether an ErrorEquals list matches an error name. */
export function matches(errorEquals: string[], error: string): boolean {
  // Runtime errors and exceeded payload quotas are terminal: no wildcard takes them.
  const terminal = error === 'States.Runtime' || error === 'States.DataLimitExceeded';
  return errorEquals.some(
    (e) => e === error || (!terminal && (e === 'States.ALL' || (e === 'States.TaskFailed' && error !== 'States.Timeout'))),
  );
}

// ---- JSONPath (the subset definitions use: fields, indexes, wildcards) ----

type Segment = { t: 'key'; v: string } | { t: 'index'; v: number } | { t: 'all' };

function parsePath(path: string): { context: boolean; segments: Segment[] } {
  const context = path.startsWith('$$');
  let rest = path.slice(context ? 2 : 1);
  const segments: Segment[] = [];
  while (rest.length) {
    let m: RegExpExecArray | null;
    if ((m = /^\.\*/.exec(rest)) || (m = /^\[\*\]/.exec(rest))) segments.push({ t: 'all' });
    else if ((m = /^\.([^.[\]]+)/.exec(rest))) segments.push({ t: 'key', v: m[1] });
    else if ((m = /^\[(\d+)\]/.exec(rest))) segments.push({ t: 'index', v: Number(m[1]) });
    else if ((m = /^\['([^']*)'\]/.exec(rest))) segments.push({ t: 'key', v: m[1] });
    else throw new Error(`the checker cannot read the JSONPath ${path}`);
    rest = rest.slice(m[0].length);
  }
  return { context, segments };
}

function lookup(path: string, value: unknown, context: unknown): { found: boolean; value?: unknown } {
  const { context: isContext, segments } = parsePath(path);
  let current: unknown[] = [isContext ? context : value];
  let wildcard = false;
  for (const s of segments) {
    const next: unknown[] = [];
    for (const v of current) {
      if (v === null || typeof v !== 'object') continue;
      if (s.t === 'all') {
        wildcard = true;
        next.push(...(Array.isArray(v) ? v : Object.values(v as Record<string, unknown>)));
      } else if (s.t === 'index') {
        if (Array.isArray(v) && s.v < v.length) next.push(v[s.v]);
      } else if (!Array.isArray(v) && Object.prototype.hasOwnProperty.call(v, s.v)) {
        next.push((v as Record<string, unknown>)[s.v]);
      }
    }
    current = next;
  }
  if (wildcard) return { found: true, value: current };
  return current.length ? { found: true, value: current[0] } : { found: false };
}

// ---- intrinsic functions ----

type IntrinsicNode = { t: 'call'; name: string; args: IntrinsicNode[] } | { t: 'literal'; v: unknown } | { t: 'path'; v: string };

function parseIntrinsic(text: string): IntrinsicNode {
  let i = 0;
  const ws = () => {
    while (text[i] === ' ') i++;
  };
  const node = (): IntrinsicNode => {
    ws();
    if (text.startsWith('States.', i)) {
      const m = /^States\.[A-Za-z]+/.exec(text.slice(i))!;
      i += m[0].length;
      if (text[i++] !== '(') throw new Error(`intrinsic ${text}: expected (`);
      const args: IntrinsicNode[] = [];
      ws();
      if (text[i] === ')') {
        i++;
        return { t: 'call', name: m[0], args };
      }
      for (;;) {
        args.push(node());
        ws();
        const c = text[i++];
        if (c === ')') return { t: 'call', name: m[0], args };
        if (c !== ',') throw new Error(`intrinsic ${text}: expected , or )`);
      }
    }
    if (text[i] === "'") {
      let s = '';
      i++;
      while (text[i] !== "'") {
        if (i >= text.length) throw new Error(`intrinsic ${text}: unterminated string`);
        if (text[i] === '\\') i++;
        s += text[i++];
      }
      i++;
      return { t: 'literal', v: s };
    }
    if (text[i] === '$') {
      const m = /^\$[^,)]*/.exec(text.slice(i))!;
      i += m[0].length;
      return { t: 'path', v: m[0].trim() };
    }
    const m = /^(-?\d+(\.\d+)?|true|false|null)/.exec(text.slice(i));
    if (!m) throw new Error(`intrinsic ${text}: cannot read an argument at ${text.slice(i)}`);
    i += m[0].length;
    return { t: 'literal', v: JSON.parse(m[0]) };
  };
  const result = node();
  ws();
  if (i !== text.length) throw new Error(`intrinsic ${text}: trailing text`);
  return result;
}
