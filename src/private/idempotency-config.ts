import { ArnFormat, Duration, Names, Stack } from 'aws-cdk-lib';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { Construct } from 'constructs';
import { DEFAULT_FUNCTION_RUNTIME, idempotencyKeyFunction, validateFunctionRuntime } from './bundled-functions';
import { functionWithOwnLogs } from './function-logs';
import { DUPLICATE_CHECK_EVENTS, WAIT_HISTORY_EVENTS } from './history-budget';
import { IdempotencyStates } from './idempotency-states';
import { validateFieldPaths, validateWholeSeconds } from './validation';
import { IdempotencyKey, IdempotencyOptions } from '../idempotency-options';
import { IdempotencyTable, IIdempotencyTable } from '../idempotency-table';

/** What a workflow with idempotency needs: its states, table and key function. */
export interface RenderedIdempotency {
  readonly states: IdempotencyStates;
  readonly table: IIdempotencyTable;
  readonly keyFunction: lambda.IFunction;
  /**
   * The most checks a waiting duplicate makes: each costs 7 states, DUPLICATE_CHECK_EVENTS (23) history
   * events, within the events its wait may spend (history-budget.ts).
   */
  readonly maxWaits: number;
}

/**
 * Check the options and create the idempotency states (and, if needed, the table) of a workflow whose
 * state machine will be called `stateMachineName` and time out after `timeout` (if given: completed
 * records then stay in the table at least that long past their start, whatever TTL). Shared by
 * `IdempotentWorkflow` and `ConcurrencyControlledWorkflow`.
 */
export function renderIdempotency(
  scope: Construct,
  options: IdempotencyOptions,
  stateMachineName: string,
  timeout?: Duration,
  waitEvents: number = WAIT_HISTORY_EVENTS,
): RenderedIdempotency {
  // How many checks fit in the history events this wait may spend.
  const checksAllowed = Math.floor(waitEvents / DUPLICATE_CHECK_EVENTS);
  const expiresAfterSeconds = fixedSeconds('expiresAfter', options.expiresAfter ?? Duration.hours(24), 1);
  const pollSeconds = fixedSeconds('duplicatePollInterval', options.duplicatePollInterval ?? Duration.seconds(10), 1);
  // By default an hour, or as long as the checks that fit in the history last at a short interval.
  const waitTimeout = options.duplicateWaitTimeout ?? Duration.seconds(Math.min(3600, Math.floor(checksAllowed * 0.75 * pollSeconds)));
  const waitSeconds = fixedSeconds('duplicateWaitTimeout', waitTimeout, 1);
  // A wait lasts half to all of the interval: three quarters on average.
  const maxWaits = Math.max(1, Math.ceil(waitSeconds / (0.75 * pollSeconds)));
  if (maxWaits > checksAllowed) {
    throw new Error(
      `\`duplicateWaitTimeout\` (${waitTimeout.toHumanString()}) at \`duplicatePollInterval\` ${Duration.seconds(pollSeconds).toHumanString()} means about ${maxWaits} checks; ` +
        `at most ${checksAllowed} fit in the ${waitEvents} history events this wait may spend (an execution fails at 25,000 events): make the interval longer or the timeout shorter`,
    );
  }
  if (options.validateFields !== undefined) {
    validateFieldPaths('validateFields', options.validateFields);
  }
  const table = options.table ?? new IdempotencyTable(scope, 'IdempotencyTable');
  const keyFunction = sharedKeyFunction(scope, validateFunctionRuntime('keyFunctionRuntime', options.keyFunctionRuntime));
  const stack = Stack.of(scope);
  const states = new IdempotencyStates(scope, {
    table,
    keyFunction,
    prefix: Names.uniqueResourceName(scope, { maxLength: 128, separator: '-' }),
    key: (options.key ?? IdempotencyKey.wholeInput())._selection,
    validate: options.validateFields === undefined ? undefined : { kind: 'fields', paths: options.validateFields },
    expiresAfterSeconds,
    // An execution completes its record at most `timeout` after its start: TTL must not come sooner.
    ttlMarginSeconds: timeout === undefined || timeout.isUnresolved() ? undefined : timeout.toSeconds() + 24 * 3600,
    pollSeconds,
    maxWaits,
    executionArnPattern: stack.formatArn({
      service: 'states',
      resource: 'execution',
      resourceName: `${stateMachineName}:*`,
      arnFormat: ArnFormat.COLON_RESOURCE_NAME,
    }),
  });
  return { states, table, keyFunction, maxWaits };
}

/** Whole seconds of a duration that must be known at synth time (no token). */
function fixedSeconds(prop: string, duration: Duration, minSeconds: number): number {
  const seconds = validateWholeSeconds(prop, duration, minSeconds);
  if (seconds === undefined) {
    throw new Error(`\`${prop}\` must be a fixed duration, known at synth time, got a token: ${duration.toString()}`);
  }
  return seconds;
}

/**
 * A physical name for a state machine, derived from the construct path: the idempotency states
 * describe executions of their own state machine, and a generated name would make the role's policy
 * depend on the state machine, which depends on the policy.
 */
export function defaultStateMachineName(scope: Construct): string {
  return Names.uniqueResourceName(scope, { maxLength: 80, separator: '-' });
}

/**
 * The key function of the stack: pure, so one serves every idempotent workflow in it that chooses the same
 * runtime (the default's construct id is the one it always had, so that existing stacks keep it).
 */
function sharedKeyFunction(scope: Construct, runtime: lambda.Runtime): lambda.IFunction {
  const stack = Stack.of(scope);
  const id = runtime.name === DEFAULT_FUNCTION_RUNTIME.name ? 'CdkSfnSemaphoreIdempotencyKey' : `CdkSfnSemaphoreIdempotencyKey-${runtime.name}`;
  const existing = stack.node.tryFindChild(id) as Construct | undefined;
  if (existing) {
    return existing.node.findChild('Function') as lambda.IFunction;
  }
  const holder = new Construct(stack, id);
  return functionWithOwnLogs(holder, (role) =>
    idempotencyKeyFunction(holder, 'Function', {
      role,
      runtime,
      timeout: Duration.seconds(10),
      memorySize: 256,
      description: 'Computes idempotency keys of execution inputs (cdk-sfn-semaphore)',
    }),
  ).fn;
}
