import * as fs from 'fs';
import { createRequire } from 'module';
import * as path from 'path';
import type * as LocalSfn from 'aws-local-stepfunctions' with { 'resolution-mode': 'require' };
import type { Random } from './random';

/*
 * aws-local-stepfunctions interprets ASL faithfully enough for our purposes, with these gaps that
 * matter to a semaphore and that we close here, at load time, on a private copy of the module:
 *
 * 1. Time compression. Every duration passes through its `sleep(ms)` (Wait states, Retry intervals)
 *    or a `setTimeout` (task and execution timeouts); all are multiplied by one factor, so ratios hold.
 * 2. `States.MathRandom` seeds itself with `Date.now()`, so executions drawing in the same millisecond
 *    draw the same number; it also includes the end value, which AWS excludes ("between the start
 *    number (inclusive) and end number (exclusive)"). We draw from the simulation's seeded generator,
 *    end excluded.
 * 3. Retry jitter uses `Math.random`; it uses the seeded generator too.
 * 4. A Task without `TimeoutSeconds` times out after 60 s; on AWS its default is 99999999 s.
 * 5. `ResultPath: "$"` should replace the whole state data with the result; the module writes the result
 *    under a key named "$" instead.
 * 6. Node 20 lacks `Promise.withResolvers`, which the module calls.
 * 7. Every intrinsic function's string result loses all its backslashes, so `States.JsonToString` of a
 *    string containing a quote gives text that is not JSON (`{"q":"a"b"}`). We leave results intact.
 *    Escapes in quoted literal arguments (`'it\'s'`) stay escaped now: asl-validator rejects such
 *    literals, and no definition we synthesize has one.
 * 8. `$$.Execution.Input` and `$$.Execution.StartTime` are the input and start of each run of the
 *    module's interpreter: inside a Parallel branch, the branch's input (its Parameters) and start; in
 *    a redriven run, the input of the state it resumes. On AWS both are the execution's. The
 *    simulator passes the execution's own in the context, and they win.
 * 9. A Pass state whose `Result` is falsy (0, false, "", null) passes its input on instead: the module
 *    tests `if (Result)`. AWS uses the Result whatever its value ("Result: the output of the state").
 * 10. Error matching as AWS documents it (https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html):
 *    `States.TaskFailed` "matches any known error name except for States.Timeout", and the module
 *    excepts only its own timeouts, not a callback task's `States.Timeout` raised by the simulator;
 *    `States.ALL` "can't catch the States.DataLimitExceeded terminal error type" (a catcher naming it
 *    can), and neither does `States.TaskFailed` here: AWS calls the error terminal, and an emulator
 *    built from recorded executions (fakecloud) matches it by name only; if AWS's TaskFailed did
 *    catch it, the simulator fails where AWS passes, never the other way round. (`States.Runtime` the
 *    module already never catches nor retries, as AWS.)
 * 11. The context object's `State` is not set at all. Each state entered gets `$$.State.Name`, its
 *    `EnteredTime` (on the simulated clock, fixed for that entry, retries included) and `RetryCount`
 *    (0, one more on each retry), as the context object documents
 *    (https://docs.aws.amazon.com/step-functions/latest/dg/input-output-contextobject.html).
 * 12. `States.Hash` digests only inputs shorter than 56 bytes correctly (one MD5/SHA block with its
 *    padding): anything longer, a state machine's ARN for one, hashes to a wrong value. We digest with
 *    Node's crypto (lower-case hex of the UTF-8 bytes, as AWS's examples give).
 * 13. A state's output over the payload quota (256 KiB) has no consequence in the module. The simulator
 *    saw it in the state's exit event, which reaches it a moment late: the next state could already
 *    have run, and its DynamoDB call landed, where AWS fails the execution at that state. The run now
 *    fails there, with States.DataLimitExceeded (the simulator's event listener gives the cause).
 * 14. A Choice rule's type test with `false` (`"IsPresent": false`, `IsNull`, `IsNumeric`, `IsString`,
 *    `IsBoolean`, `IsTimestamp`) never matches in the module (it computes `false && ...`); the States
 *    Language matches it when the test fails (an absent field for `"IsPresent": false`). It now compares
 *    the test's outcome with the rule's value.
 *
 * 15. (Not a patch.) The module's timers are the simulator's: its `setTimeout` and `clearTimeout` are
 *    passed in, so that stopping the simulator clears what the module left behind. A task's timeout is
 *    cleared only when the task settles, and an execution's only when its run ends: a task still pending
 *    at the stop (a callback nobody sends, a call into a stopped database) would otherwise leave a timer
 *    of up to 24.8 days (Node's longest) keeping the process alive.
 *
 * Each patch must apply exactly once, so an upgrade of the module that moves the code fails loudly
 * here instead of silently running at full speed.
 */

if (!(Promise as any).withResolvers) {
  (Promise as any).withResolvers = function withResolvers<T>() {
    let resolve!: (value: T | PromiseLike<T>) => void;
    let reject!: (reason?: unknown) => void;
    const promise = new Promise<T>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    return { promise, resolve, reject };
  };
}

const PATCHES: Array<[string, string]> = [
  [
    '    switch (algorithm) {\n      case "MD5":\n        return md5.getDigest(str);\n',
    '    return require("crypto").createHash({ "MD5": "md5", "SHA-1": "sha1", "SHA-256": "sha256", "SHA-384": "sha384", "SHA-512": "sha512" }[algorithm])' +
      '.update(str, "utf8").digest("hex");\n    switch (algorithm) {\n      case "MD5":\n        return md5.getDigest(str);\n',
  ],
  ['function sleep(ms, abortSignal) {\n', 'function sleep(ms, abortSignal) {\n  ms = ms * __TIME_SCALE__;\n'],
  ['var DEFAULT_TIMEOUT_SECONDS = 60;', 'var DEFAULT_TIMEOUT_SECONDS = 99999999;'],
  [
    'setTimeout(() => rejectTimeout(new StatesTimeoutError()), timeoutMs)',
    'setTimeout(() => rejectTimeout(new StatesTimeoutError()), Math.min(timeoutMs * __TIME_SCALE__, 2147483647))',
  ],
  ['}, this.definition.TimeoutSeconds * 1e3);', '}, this.definition.TimeoutSeconds * 1e3 * __TIME_SCALE__);'],
  [
    'return getRandomNumber(min, max, rng);',
    'return seed === void 0 ? getRandomNumber(min, max - 1, __RANDOM__) : getRandomNumber(min, max - 1, rng);',
  ],
  ['const sanitizedPath = path.replace("$.", "");', 'if (path === "$") return result;\n  const sanitizedPath = path.replace("$.", "");'],
  [
    'waitTimeBeforeRetry = getRandomNumber(0, waitTimeBeforeRetry);',
    'waitTimeBeforeRetry = getRandomNumber(0, waitTimeBeforeRetry, __RANDOM__);',
  ],
  ['      result = result.replaceAll("\\\\", "");\n', ''],
  [
    '        Input: input,\n        StartTime: (/* @__PURE__ */ new Date()).toISOString()\n',
    '        Input: options.runOptions?.context?.Execution?.Input ?? input,\n        StartTime: options.runOptions?.context?.Execution?.StartTime ?? (/* @__PURE__ */ new Date()).toISOString()\n',
  ],
  ['    if (this.stateDefinition.Result) {\n', '    if ("Result" in this.stateDefinition) {\n'],
  [
    '        options.eventLogger.dispatchStateExitedEvent(currStateName, currState.Type, currInput, currResult);\n',
    '        options.eventLogger.dispatchStateExitedEvent(currStateName, currState.Type, currInput, currResult);\n' +
      '        if (Buffer.byteLength(JSON.stringify(currResult ?? null), "utf8") > 262144) {\n' +
      '          const exceeded = new Error(`The state \'${currStateName}\' has an output above the quota of 262144 bytes`);\n' +
      '          exceeded.name = "States.DataLimitExceeded";\n' +
      '          throw exceeded;\n' +
      '        }\n',
  ],
  [
    '        options.eventLogger.dispatchStateEnteredEvent(currStateName, currState.Type, currInput);\n',
    '        context.State = { Name: currStateName, EnteredTime: new Date(__NOW__()).toISOString(), RetryCount: 0 };\n        options.eventLogger.dispatchStateEnteredEvent(currStateName, currState.Type, currInput);\n',
  ],
  [
    '        return this.execute(input, context, options);\n',
    '        context.State = { ...context.State, RetryCount: (context.State?.RetryCount ?? 0) + 1 };\n        return this.execute(input, context, options);\n',
  ],
  [
    '        const isErrorWildcard = catcherError === WILDCARD_ERROR;\n        const isErrorTaskWildcard = catcherError === TASK_STATE_WILDCARD_ERROR && this.stateDefinition.Type === "Task" && !(error instanceof StatesTimeoutError);\n',
    '        const isErrorWildcard = catcherError === WILDCARD_ERROR && error.name !== "States.DataLimitExceeded";\n        const isErrorTaskWildcard = catcherError === TASK_STATE_WILDCARD_ERROR && this.stateDefinition.Type === "Task" && !(error instanceof StatesTimeoutError) && error.name !== "States.Timeout" && error.name !== "States.DataLimitExceeded";\n',
  ],
  [
    '        const isErrorTaskWildcard = retrierError === TASK_STATE_WILDCARD_ERROR && this.stateDefinition.Type === "Task" && !(error instanceof StatesTimeoutError);\n',
    '        const isErrorTaskWildcard = retrierError === TASK_STATE_WILDCARD_ERROR && this.stateDefinition.Type === "Task" && !(error instanceof StatesTimeoutError) && error.name !== "States.Timeout" && error.name !== "States.DataLimitExceeded";\n',
  ],
  ['return IsPresentTrue && varValue !== void 0;', 'return IsPresentTrue === (varValue !== void 0);'],
  ['return isNullTrue && varValue === null;', 'return isNullTrue === (varValue === null);'],
  ['return IsNumericTrue && typeof varValue === "number";', 'return IsNumericTrue === (typeof varValue === "number");'],
  ['return IsStringTrue && typeof varValue === "string";', 'return IsStringTrue === (typeof varValue === "string");'],
  ['return IsBooleanTrue && typeof varValue === "boolean";', 'return IsBooleanTrue === (typeof varValue === "boolean");'],
  ['return IsTimestampTrue && isRFC3339Timestamp(varValue);', 'return IsTimestampTrue === isRFC3339Timestamp(varValue);'],
];

export type LocalStepFunctions = typeof LocalSfn;

/** The timers the module sets: the simulator's, which it clears when it stops. */
export interface ModuleTimers {
  setTimeout(callback: () => void, ms: number): NodeJS.Timeout;
  clearTimeout(timer: NodeJS.Timeout | undefined): void;
}

/**
 * Load a private copy of aws-local-stepfunctions whose clock runs `timeScale` times real time
 * (0.01: one simulated second takes 10 ms), whose randomness comes from `random`, whose states
 * are entered at `now()` (epoch milliseconds, the simulated clock), and whose timers are `timers`.
 */
export function loadLocalStepFunctions(
  timeScale: number,
  random: Random,
  now: () => number,
  timers: ModuleTimers,
): LocalStepFunctions {
  const hostRequire = createRequire(__filename);
  const filename = hostRequire.resolve('aws-local-stepfunctions');
  let source = fs.readFileSync(filename, 'utf-8');
  for (const [from, to] of PATCHES) {
    const count = source.split(from).length - 1;
    if (count !== 1) {
      throw new Error(`aws-local-stepfunctions patch expected exactly one match of ${JSON.stringify(from)}, found ${count}`);
    }
    source = source.replace(from, to);
  }
  // `new Function` compiles in the caller's realm. Under Jest that is the test's sandbox, whose objects
  // the module must recognize as plain (it checks `Object.getPrototypeOf(x) === Object.prototype`).
  const wrapper = new Function(
    'exports',
    'require',
    'module',
    '__filename',
    '__dirname',
    '__TIME_SCALE__',
    '__RANDOM__',
    '__NOW__',
    'setTimeout',
    'clearTimeout',
    `${source}\n//# sourceURL=${filename}`,
  );
  const mod = { exports: {} as LocalStepFunctions };
  const { setTimeout: moduleSetTimeout, clearTimeout: moduleClearTimeout } = timers;
  wrapper(mod.exports, createRequire(filename), mod, filename, path.dirname(filename), timeScale, random, now, moduleSetTimeout, moduleClearTimeout);
  return mod.exports;
}
