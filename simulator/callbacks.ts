import { ApiError } from './sfn-api';

/** What a task of a stopped execution ends with (the interpreter, stopped too, acts on it no more). */
export function executionStopped(): Error {
  return Object.assign(new Error('The execution has stopped'), { name: 'Simulator.ExecutionStopped' });
}

/*
 * The callback pattern (`.waitForTaskToken`), as Step Functions runs it: each attempt of a task gets
 * its own token (`$$.Task.Token`), the task makes its call and then waits until someone sends
 * SendTaskSuccess or SendTaskFailure with that token, or until its HeartbeatSeconds pass without a
 * SendTaskHeartbeat, or its TimeoutSeconds pass. Then the token is closed: a call with it fails with
 * `TaskTimedOut`, as it does on AWS; a token never issued fails with `InvalidToken`.
 */

/** Stands for `$$.Task.Token` in a definition until the task's attempt has its token. */
export const TASK_TOKEN_MARKER = '__SIMULATOR_TASK_TOKEN__';

export const WAIT_FOR_TASK_TOKEN = '.waitForTaskToken';

/** A copy of a definition in which every `"X.$": "$$.Task.Token"` reads the marker instead. */
export function withTokenMarkers(definition: unknown): unknown {
  if (Array.isArray(definition)) return definition.map(withTokenMarkers);
  if (definition === null || typeof definition !== 'object') return definition;
  const result: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(definition as Record<string, unknown>)) {
    if (key.endsWith('.$') && value === '$$.Task.Token') result[key.slice(0, -2)] = TASK_TOKEN_MARKER;
    else result[key] = withTokenMarkers(value);
  }
  // The simulator runs the heartbeat and the timeout of callback tasks itself (the interpreter's own
  // timeout would leave the token open).
  const state = result as { Type?: string; Resource?: string; TimeoutSeconds?: number };
  if (state.Type === 'Task' && state.Resource?.endsWith(WAIT_FOR_TASK_TOKEN)) delete state.TimeoutSeconds;
  return result;
}

/** The task's input with the marker replaced by its token. */
export function withToken(input: unknown, token: string): unknown {
  if (input === TASK_TOKEN_MARKER) return token;
  if (Array.isArray(input)) return input.map((v) => withToken(v, token));
  if (input === null || typeof input !== 'object') return input;
  return Object.fromEntries(Object.entries(input as Record<string, unknown>).map(([k, v]) => [k, withToken(v, token)]));
}

/** What a waiting task hears: its output, or an error to fail with. */
type Outcome = { output: unknown } | { error: string; cause: string };

interface Waiter {
  readonly executionArn: string;
  readonly stateName: string;
  readonly settle: (outcome: Outcome) => void;
  /** Close the token without an outcome, and disarm its timers. */
  readonly close: () => void;
  heartbeat: () => void;
  open: boolean;
}

/** Tokens issued and the tasks waiting on them. */
export class CallbackTokens {
  /** Length of the tokens issued (at least what their content needs): AWS's are opaque, up to 2,048 characters. */
  public tokenLength = 0;

  private readonly waiters = new Map<string, Waiter>();
  private issued = 0;

  constructor(
    private readonly sleep: (seconds: number, signal?: AbortSignal) => Promise<void>,
  ) {}

  /** A new token for one attempt of a task. */
  public issue(executionArn: string, stateName: string): string {
    const serial = ++this.issued;
    // Opaque, like AWS's, and as long as they are in practice: the queue stores them, and DynamoDB bills by size.
    const token = `AQ${Buffer.from(JSON.stringify({ e: executionArn, s: stateName, n: serial })).toString('base64')}`;
    return token.length >= this.tokenLength ? token : `${token}.${'x'.repeat(this.tokenLength - token.length - 1)}`;
  }

  /**
   * Wait for `token`'s outcome. `timeouts` come from the state; `stopped` closes the token when the
   * execution stops, and the promise then rejects (a stopped execution runs nothing more, whatever
   * the outcome; a promise that never settled would keep the interpreter's task timer alive).
   */
  public wait(
    token: string,
    executionArn: string,
    stateName: string,
    timeouts: { heartbeatSeconds?: number; timeoutSeconds?: number },
    stopped: AbortSignal,
  ): Promise<unknown> {
    return new Promise((resolve, reject) => {
      const timers = new AbortController();
      const close = () => {
        waiter.open = false;
        timers.abort();
      };
      const waiter: Waiter = {
        executionArn,
        stateName,
        open: true,
        settle: (outcome) => {
          if (!waiter.open) return;
          close();
          if ('output' in outcome) resolve(outcome.output);
          else reject(Object.assign(new Error(outcome.cause), { name: outcome.error }));
        },
        close,
        heartbeat: () => undefined,
      };
      this.waiters.set(token, waiter);
      stopped.addEventListener(
        'abort',
        () => {
          if (!waiter.open) return;
          close();
          reject(executionStopped());
        },
        { once: true },
      );
      if (timeouts.timeoutSeconds !== undefined) {
        void this.sleep(timeouts.timeoutSeconds, timers.signal).then(() =>
          waiter.settle({ error: 'States.Timeout', cause: `The task '${stateName}' had no callback within TimeoutSeconds (${timeouts.timeoutSeconds})` }),
        );
      }
      if (timeouts.heartbeatSeconds !== undefined) {
        let beat = new AbortController();
        const arm = () => {
          beat.abort();
          beat = new AbortController();
          const signal = AbortSignal.any([beat.signal, timers.signal]);
          void this.sleep(timeouts.heartbeatSeconds!, signal).then(() => {
            if (!signal.aborted) {
              waiter.settle({ error: 'States.HeartbeatTimeout', cause: `The task '${stateName}' had no heartbeat within HeartbeatSeconds (${timeouts.heartbeatSeconds})` });
            }
          });
        };
        waiter.heartbeat = arm;
        arm();
      }
    });
  }

  /**
   * Close a token whose task failed before it could be called back (its call failed), and disarm its
   * timeout and heartbeat timers: armed, they would keep the process open until they fired.
   */
  public close(token: string): void {
    this.waiters.get(token)?.close();
  }

  public sendTaskSuccess(token: string, output: string): void {
    const waiter = this.openWaiter(token);
    let parsed: unknown;
    try {
      parsed = JSON.parse(output);
    } catch {
      throw new ApiError('InvalidOutput', 'Invalid Output: the output is not JSON');
    }
    waiter.settle({ output: parsed });
  }

  public sendTaskFailure(token: string, error?: string, cause?: string): void {
    this.openWaiter(token).settle({ error: error ?? '', cause: cause ?? '' });
  }

  public sendTaskHeartbeat(token: string): void {
    this.openWaiter(token).heartbeat();
  }

  /** Tokens whose tasks still wait, for tests. */
  public get openTokens(): number {
    return [...this.waiters.values()].filter((w) => w.open).length;
  }

  private openWaiter(token: string): Waiter {
    const waiter = this.waiters.get(token);
    if (!waiter) {
      throw new ApiError('InvalidToken', `Invalid Token: '${token.slice(0, 40)}'`);
    }
    if (!waiter.open) {
      throw new ApiError('TaskTimedOut', 'Task Timed Out: Provided task does not exist anymore');
    }
    return waiter;
  }
}
