import { Annotations, Duration, Names, RemovalPolicy, Token } from 'aws-cdk-lib';
import * as cloudwatch from 'aws-cdk-lib/aws-cloudwatch';
import * as events from 'aws-cdk-lib/aws-events';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as logs from 'aws-cdk-lib/aws-logs';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { Construct } from 'constructs';
import { CleanFromIncomplete } from './clean-from-incomplete';
import { IdempotencyOptions } from './idempotency-options';
import { IIdempotencyTable } from './idempotency-table';
import { validateFunctionRuntime } from './private/bundled-functions';
import {
  BODY_SLOT_ROUND_EVENTS,
  BODY_SLOT_WAIT_EVENTS,
  DUPLICATE_CHECK_EVENTS,
  POLL_ROUND_EVENTS,
  QUEUE_CHECK_ROUND_EVENTS,
  roundsWithin,
  WAIT_HISTORY_EVENTS,
} from './private/history-budget';
import { defaultStateMachineName, renderIdempotency } from './private/idempotency-config';
import { lockStripeName, MAX_CONCURRENCY_LIMIT, MAX_LOCK_NAME_LENGTH } from './private/lock-schema';
import { WAKE_ACTIONS } from './private/queue-states';
import { numberValue, stringValue } from './private/runtime-value';
import { stateMachineLogs } from './private/state-machine-defaults';
import { STATE } from './private/state-names';
import {
  highLimitWarning,
  highRateWarning,
  humanSeconds,
  isLockStripeCount,
  lockStripesConflict,
  validateConcurrencyLimit,
  validateLockName,
  validateLockStripes,
  validatePermitPath,
  validatePermits,
  validateWholeSeconds,
} from './private/validation';
import { grantWakeToRole, registerWaiter } from './private/wake-grants';
import {
  ACQUIRE_TIMEOUT_ERROR,
  DefinitionSpec,
  firstWaitOutsideParallel,
  INVALID_LIMIT_ERROR,
  INVALID_LOCK_NAME_ERROR,
  INVALID_PERMITS_ERROR,
  renderDefinition,
} from './private/workflow-definition';
import { RateLimit } from './rate-limit';
import { SemaphoreReconciler } from './semaphore-reconciler';
import { ISemaphoreTable, SemaphoreTable } from './semaphore-table';
import { WaitStrategy } from './wait-strategy';

/**
 * Properties of a `ConcurrencyControlledWorkflow`.
 */
export interface ConcurrencyControlledWorkflowProps {
  /**
   * The states to run while holding a permit.
   *
   * They receive the execution input unchanged, and their output becomes the execution's output. If
   * they fail, the permit is given back and the execution fails with their own error and cause.
   */
  readonly body: sfn.IChainable;

  /**
   * Name of the lock.
   *
   * Workflows that use the same table and lock name share the lock's permits. A
   * `JsonPath.stringAt('$.path')` reads the name from each execution's input, so one workflow can
   * guard many resources (one lock per tenant, per database, ...).
   *
   * @default - derived from this construct's path, so unique to this workflow
   */
  readonly lockName?: string;

  /**
   * How many executions may hold a permit of the lock at the same time (with `permits`, how many
   * permits: an execution then takes several).
   *
   * A `JsonPath.numberAt('$.path')` reads it from each execution's input. Each acquire compares the
   * permits in use with its own limit, so workflows sharing a lock should agree on it.
   *
   * At most 1,000: the holders share the lock's DynamoDB item, at most 380 bytes each, and an item
   * holds 400 KB. A limit read from the input above that fails the execution with
   * `SemaphoreInvalidLimit` before it takes anything.
   *
   * Beside a `rateLimit` whose count is higher, each body also takes one of `concurrencyLimit` body
   * slots, which it gives back as soon as it ends (its permit stays held for the rate's interval).
   * Beside a `rateLimit` whose count is lower, each body takes a slot too, and its permit goes back (or
   * to the next waiter) once the interval has passed while the body runs on in its slot: up to
   * `concurrencyLimit` bodies run at once (with `concurrencyLimit` plus the count at most 1,000). An
   * execution holding a permit polls for a slot about 220 times, then fails with
   * `SemaphoreAcquireTimeout`: first after `pollInterval`, then 1.2 times later each try, up to a
   * minute apart (about 3.5 hours in all; a `pollInterval` of a minute or more stays fixed, 220 times
   * `pollInterval`), since a slot is held for a whole body. The same as the count: each body holds its
   * permit for the longer of the body and the interval.
   *
   * @default 1, or with a `rateLimit`, none: only the rate bounds the bodies, whose permits go back once the
   * interval has passed, while the bodies may still run
   */
  readonly concurrencyLimit?: number;

  /**
   * Split the lock into this many locks ("stripes") of `concurrencyLimit / lockStripes` permits each,
   * named `<lockName>#0` to `<lockName>#<lockStripes - 1>`, for a limit in the hundreds.
   *
   * Each execution draws one stripe at random when it starts (one transition more, "Pick Lock Stripe")
   * and takes its permit there, so at most `concurrencyLimit` bodies run at once in all. A lock's
   * holders share its DynamoDB item, whose every write is billed by its size, and one item's partition
   * takes 1,000 write units a second: split, each item holds a share of the holders on a partition of
   * its own. What it costs: the permits are not pooled (an execution waits for a permit of its stripe
   * while another stripe has one free), first come, first served holds within a stripe only, and the
   * cleanup of a stopped execution reads every stripe. Metrics are per stripe: see README, "A limit in
   * the hundreds: split the lock". Change it only while no execution runs: the cleanup and the redrive
   * guard know the stripes of the current definition.
   *
   * `concurrencyLimit` must be a number that `lockStripes` divides, each stripe's share at most 1,000;
   * not with `permits`, `rateLimit` or `permitPath` yet. Other workflows and the CLI share
   * the permits of a stripe by naming it (`exports#3`).
   *
   * @default 1 - one lock, not split
   */
  readonly lockStripes?: number;

  /**
   * The table holding the lock.
   *
   * @default - a new `SemaphoreTable`
   */
  readonly table?: ISemaphoreTable;

  /**
   * How an execution that finds the lock full waits for a permit.
   *
   * With `QUEUE`, it joins a first-in, first-out queue of waiters (a ticket item each) and sleeps in
   * a `.waitForTaskToken` task; a release that finds waiters hands its permit straight to the oldest
   * and wakes it with `SendTaskSuccess`. Waiting then costs one transition and one write however long
   * it lasts (one more of each per `queueCheckInterval` it outlasts), a freed permit is used at once
   * and waiters are served in order. With `POLLING`, it tries again every `pollInterval`.
   *
   * Workflows sharing a lock may use different strategies: every release hands off to waiters.
   *
   * @default WaitStrategy.QUEUE
   */
  readonly waitStrategy?: WaitStrategy;

  /**
   * With the queue, how long a waiter sleeps before it checks whether a permit was handed to it and
   * the wake-up lost (the releaser stopped between the hand-off and `SendTaskSuccess`, or the call
   * failed), or whether a permit is free that nobody handed over. It then takes the permit, or
   * sleeps again in its place in the queue: each interval a wait outlasts costs four transitions (the
   * check, counting it against the history budget, the new sleep) and two writes. The longest wait is
   * 1,198 intervals (`longestWait`). Whole seconds, at least 1 second.
   *
   * @default Duration.minutes(5)
   */
  readonly queueCheckInterval?: Duration;

  /**
   * Where the body's input gets the permit, `{ "fencingToken": 17 }`: a number that strictly
   * increases with every acquisition of the lock, to pass to systems that must reject a stale
   * holder. The execution input must then be a JSON object; the field is set (or replaced) there.
   *
   * @default - the body's input is the execution input, unchanged
   */
  readonly permitPath?: string;

  /**
   * How often a waiting execution tries again to take a permit, with the `POLLING` strategy (and
   * with the queue when it is full, or when it lost its place).
   *
   * The first wait is a random whole number of seconds from 1 to `pollInterval` (full jitter), so
   * executions started together do not poll together; after that the execution polls every
   * `pollInterval`. Each poll costs two state transitions and one DynamoDB write. Whole seconds, at
   * least 1 second.
   *
   * A wait for a body slot (a `rateLimit` beside a `concurrencyLimit` other than its count) tries first
   * after `pollInterval`, then 1.2 times later each try, up to a minute apart.
   *
   * @default Duration.seconds(3)
   */
  readonly pollInterval?: Duration;

  /**
   * How long an execution waits for a permit before it fails with the error `SemaphoreAcquireTimeout`.
   *
   * Whole seconds, at least 1 second, and at most `longestWait`: every wait has a history budget, so
   * that it ends with this error, and gives back what it holds, long before Step Functions' limit of
   * 25,000 history events fails the execution (`States.Runtime`, and no redrive).
   *
   * @default - `longestWait`: 1,198 rounds of `queueCheckInterval` with the queue (4 days 3 hours 50
   * minutes at 5 minutes), 2,568 of `pollInterval` polling (2 hours 8 minutes at 3 seconds); fewer with
   * idempotency
   */
  readonly acquireTimeout?: Duration;

  /**
   * Name of the state machine.
   *
   * @default - a name generated by CloudFormation
   */
  readonly stateMachineName?: string;

  /**
   * Type of the state machine. Only `STANDARD` is supported: Express workflows emit no status-change
   * events (a stopped execution's permit would never be freed) and run at least once (a permit could
   * be taken twice).
   *
   * @default StateMachineType.STANDARD
   */
  readonly stateMachineType?: sfn.StateMachineType;

  /**
   * Maximum run time of an execution. A timed-out execution's permit is freed by the cleanup.
   *
   * @default - no timeout (Step Functions' limit for Standard workflows is one year)
   */
  readonly timeout?: Duration;

  /**
   * Logging of the state machine.
   *
   * @default - a new log group, level ALL, without execution data
   */
  readonly logs?: sfn.LogOptions;

  /**
   * Whether the state machine sends traces to X-Ray.
   *
   * @default true
   */
  readonly tracingEnabled?: boolean;

  /**
   * The IAM role the state machine runs with.
   *
   * @default - a new role with exactly the permissions the definition needs
   */
  readonly role?: iam.IRole;

  /**
   * What happens to the state machine when it leaves the stack.
   *
   * @default RemovalPolicy.DESTROY
   */
  readonly removalPolicy?: RemovalPolicy;

  /**
   * A comment on the state machine definition.
   *
   * @default - a comment that names the lock
   */
  readonly comment?: string;

  /**
   * How long an execution may hold a permit. An execution still holding one past its lease is stopped
   * by the reconciler (error `SemaphoreLeaseExpired`), and only then is its permit released. The
   * lease is enforced when the reconciler runs, so up to `reconcileEvery` late. With a `rateLimit` and
   * no `concurrencyLimit`, the permit goes back once the interval has passed, so a lease never stops
   * a long body there (with a `concurrencyLimit` above the rate's count, the body's slot keeps the lease).
   *
   * @default - no lease: an execution holds its permit for as long as it runs
   */
  readonly leaseDuration?: Duration;

  /**
   * How often the reconciler sweeps the lock table for permits no running execution holds.
   *
   * @default Duration.minutes(5)
   */
  readonly reconcileEvery?: Duration;

  /**
   * Whether the reconciler runs on its schedule. Disable it to run sweeps only on demand (invoke
   * `reconciler.reconcilerFunction`).
   *
   * @default true
   */
  readonly reconcilerScheduleEnabled?: boolean;

  /**
   * Runtime of the reconciler's function: a Node.js runtime, `nodejs22.x` or newer. Lambda deprecates
   * `nodejs22.x` on 2027-04-30 and blocks creating functions on it from 2027-06-01; choose a newer one
   * then (`new lambda.Runtime('nodejs24.x', lambda.RuntimeFamily.NODEJS)` where aws-cdk-lib lacks
   * `Runtime.NODEJS_24_X`). The idempotency key function has its own, `idempotency.keyFunctionRuntime`.
   *
   * @default lambda.Runtime.NODEJS_22_X
   */
  readonly reconcilerRuntime?: lambda.Runtime;

  /**
   * Whether to create a CloudWatch dashboard of the workflow: executions, acquisitions, waits,
   * acquire timeouts, permits in use (by weight), holders, queued waiters, permits reclaimed, and with a
   * `rateLimit`, the permits the rate holds.
   *
   * @default false
   */
  readonly dashboard?: boolean;

  /**
   * Make the workflow idempotent: an execution whose input repeats an earlier one's returns the stored
   * result instead of running the body again, and a duplicate that arrives while the first still runs
   * waits for its result. Repeats are recognized before a permit is taken, so they never wait for one.
   *
   * @default - not idempotent: every execution runs the body
   */
  readonly idempotency?: IdempotencyOptions;

  /**
   * At most so many acquisitions of the lock in any interval (for example `RateLimit.perSecond(10)`),
   * beside or instead of `concurrencyLimit`. An execution over the rate waits, as for a full lock.
   *
   * Each acquisition holds its permit for at least the interval: the body runs beside a Wait of that
   * length, and the cleanup and the reconciler free a stopped execution's permit only once the interval
   * has passed since it stopped. So at most `count` bodies start in any interval, wherever it begins
   * (a sliding window: the worst burst is `count`, never twice that). The lock's permits are then
   * `count`. Without a `concurrencyLimit`, a permit goes back once the interval has passed since its
   * body started, while the body may still run: bodies longer than the interval do not slow the rate.
   * With a `concurrencyLimit` of exactly `count`, each permit is held for the longer of the body and
   * the interval, so at most `count` bodies run at once. A `concurrencyLimit` below `count`
   * becomes body slots: each body takes one beside its permit and gives it back when it ends, so that
   * both limits are reached (a holder that finds every slot taken polls for one, backing off from
   * `pollInterval`). Above `count`, each body takes a slot too, and its permit goes back once the
   * interval has passed while the body runs on: up to `concurrencyLimit` bodies run at once.
   * Every workflow on the lock must declare the same rate; the acquire records
   * its interval on the lock item, and the CLI's and the client's permits are held as long. A lease
   * must be at least the interval.
   *
   * @default - no rate limit: only `concurrencyLimit` applies
   */
  readonly rateLimit?: RateLimit;

  /**
   * How many of the lock's permits one execution takes: its weight. A heavy job can take 4 of 10
   * database connections while a light one takes 1; the body runs only while the execution holds all
   * of them, and every release (the workflow's, the cleanup's, the reconciler's, the CLI's
   * `force-release`) gives back exactly what the execution took, read from its entry on the lock item.
   *
   * An integer from 1 to 100, and at most `concurrencyLimit`. A `JsonPath.numberAt('$.path')` reads it
   * from each execution's input; a value that is not such an integer fails the execution with
   * `SemaphoreInvalidPermits` before it takes anything.
   *
   * A weighted execution waits in the queue (`waitStrategy` defaults to `QUEUE`), first come, first
   * served: a heavy waiter whose turn comes is handed one permit and
   * collects the rest (the lock's one collector); until it has them nobody else takes a permit, and
   * releases give theirs back to it. Lighter waiters behind it wait though permits are free (at most
   * the heavy one's weight less one, for at most the bodies that were running when its turn came).
   * A heavy waiter handed a permit while another collects gives it back and queues again. A weighted
   * holder that releases while executions wait in the lock's queue hands its permits to them one at a
   * time. With `waitStrategy: WaitStrategy.POLLING` a weighted execution polls instead, which is not
   * first come, first served: under a steady stream of lighter acquisitions, a heavy one can wait until
   * its `acquireTimeout`. Not with `rateLimit`.
   *
   * @default 1
   */
  readonly permits?: number;
}

/**
 * A Standard Step Functions state machine that runs `body` while holding a permit of a DynamoDB
 * semaphore, so that at most `concurrencyLimit` executions (of this and every workflow sharing the
 * lock) are inside it at once.
 *
 * - Taking a permit is one conditional `UpdateItem`. An execution that finds the lock full waits and
 *   polls; it never retries the full lock as if it were an error.
 * - The body runs inside a `Parallel`. When it succeeds, the permit is given back and the body's
 *   output is the execution's output; when it fails, the permit is given back and the execution fails
 *   with the body's own error and cause.
 * - Executions that are stopped, time out or fail outside the body never reach that release: an
 *   EventBridge rule starts a cleanup state machine (`CleanFromIncomplete`) that frees their permit.
 *
 * An uncontended execution costs 3 state transitions and 2 DynamoDB writes beside the body.
 *
 * @example
 * import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
 * import { ConcurrencyControlledWorkflow } from 'cdk-sfn-semaphore';
 *
 * declare const doWork: sfn.IChainable;
 * new ConcurrencyControlledWorkflow(this, 'Workflow', {
 *   body: doWork,
 *   concurrencyLimit: 5,
 * });
 */
export class ConcurrencyControlledWorkflow extends Construct {
  /**
   * Error of an execution that waited `acquireTimeout` without getting a permit.
   */
  public static readonly ACQUIRE_TIMEOUT_ERROR: string = ACQUIRE_TIMEOUT_ERROR;

  /**
   * Error of an execution whose `concurrencyLimit`, read from its input, is not a number from 1 to 1,000.
   */
  public static readonly INVALID_LIMIT_ERROR: string = INVALID_LIMIT_ERROR;

  /**
   * Error of an execution whose `lockName`, read from its input, is missing, not a string, empty, or
   * contains the character U+001F (which keys the queue's ticket items).
   */
  public static readonly INVALID_LOCK_NAME_ERROR: string = INVALID_LOCK_NAME_ERROR;

  /**
   * Error of an execution whose `permits`, read from its input, is not an integer from 1 to 100 and
   * at most its concurrency limit.
   */
  public static readonly INVALID_PERMITS_ERROR: string = INVALID_PERMITS_ERROR;

  /**
   * The longest an execution waits for a permit before it fails with `SemaphoreAcquireTimeout`, when
   * `acquireTimeout` does not end it sooner: as many rounds of `queueCheckInterval` (with the queue) or
   * `pollInterval` (polling) as fit in the history budget of its wait, 18,000 of the 25,000 events
   * Step Functions allows an execution (less what idempotency's wait for a duplicate takes). With the
   * queue, a wait that keeps losing races for a free permit gives up sooner, after the same number of
   * events. Undefined when the interval is a token. (A Standard execution also ends after a year.)
   */
  public readonly longestWait?: Duration;

  /**
   * The protected state machine.
   */
  public readonly stateMachine: sfn.StateMachine;

  /**
   * The table holding the lock.
   */
  public readonly table: ISemaphoreTable;

  /**
   * Name of the lock (a JSONPath token when it is read from the execution input).
   */
  public readonly lockName: string;

  /**
   * How many locks the lock is split into (`lockStripes`): 1, or stripes named `<lockName>#0` to
   * `<lockName>#<lockStripes - 1>`, each of `concurrencyLimit / lockStripes` permits.
   */
  public readonly lockStripes: number;

  /**
   * The cleanup that frees the permits of stopped, timed-out and failed executions.
   */
  public readonly cleanup: CleanFromIncomplete;

  /**
   * The state machine that frees a stopped execution's permit.
   */
  public readonly cleanupStateMachine: sfn.StateMachine;

  /**
   * The EventBridge rule that starts `cleanupStateMachine`.
   */
  public readonly cleanupRule: events.Rule;

  /**
   * The sweep that frees permits the cleanup missed, and enforces leases.
   */
  public readonly reconciler: SemaphoreReconciler;

  /**
   * Where the state machine logs (the metrics of acquisitions, waits and timeouts are read from it).
   */
  public readonly logGroup: logs.ILogGroup;

  /**
   * CloudWatch namespace of the workflow's own metrics (acquisitions, waits, acquire timeouts).
   */
  public readonly metricsNamespace: string;

  /**
   * The table of idempotency records, when the workflow is idempotent.
   */
  public readonly idempotencyTable?: IIdempotencyTable;

  constructor(scope: Construct, id: string, props: ConcurrencyControlledWorkflowProps) {
    super(scope, id);

    if (props.stateMachineType === sfn.StateMachineType.EXPRESS) {
      throw new Error(
        '`stateMachineType` must be STANDARD, got: EXPRESS. Express executions emit no status-change events, so a stopped execution\'s permit would never be freed, and run at least once, so a permit could be taken twice',
      );
    }
    // A split lock's stripes add `#<n>` to the name: the default leaves room for it.
    const stripeSuffix = isLockStripeCount(props.lockStripes ?? 1) && props.lockStripes! > 1 ? lockStripeName('', props.lockStripes! - 1).length : 0;
    this.lockName = props.lockName ?? defaultLockName(this, MAX_LOCK_NAME_LENGTH - stripeSuffix);
    validateLockName(this.lockName);
    const lockStripes = props.lockStripes ?? 1;
    // Split, each stripe is a lock of its share of the limit: the limit below is a stripe's.
    // What a split lock does not serve yet: synth refuses it beside lockStripes, and the high-limit warning suggests no split.
    const stripeConflicts = {
      permits: props.permits !== undefined,
      rateLimit: props.rateLimit !== undefined,
      permitPath: props.permitPath !== undefined,
    };
    const stripeLimit = validateLockStripes(lockStripes, props.concurrencyLimit, this.lockName, stripeConflicts);
    validateConcurrencyLimit(stripeLimit ?? 1);
    this.lockStripes = lockStripes;
    const rate = props.rateLimit;
    const permits = props.permits === undefined ? undefined : numberValue('permits', props.permits);
    const weighted = permits !== undefined && !(permits.inputPath === undefined && permits.fixed === 1);
    if (props.permits !== undefined) {
      validatePermits(props.permits, props.concurrencyLimit ?? 1);
      // The acquire's gate (limit - permits) is computed at synth, or by intrinsic functions from the input.
      if (permits!.inputPath === undefined && Token.isUnresolved(props.permits)) {
        throw new Error('`permits` must be a number, or JsonPath.numberAt(...) to read it from the input, got a deploy-time token');
      }
      const limitValue = numberValue('concurrencyLimit', props.concurrencyLimit ?? 1);
      if (weighted && limitValue.inputPath === undefined && Token.isUnresolved(props.concurrencyLimit)) {
        throw new Error(
          '`concurrencyLimit` must be a number, or JsonPath.numberAt(...) to read it from the input, beside `permits`, got a deploy-time token: ' +
            'the acquire takes the permits while at most the limit less them are in use',
        );
      }
    }
    if (weighted && rate) {
      throw new Error(
        '`permits` and `rateLimit` cannot be combined yet: the rate counts acquisitions, and a weighted acquisition takes several permits at once. Set one of them',
      );
    }
    // A concurrency limit other than the rate's count: the lock's permits are the rate's, and each body takes a
    // slot beside its permit, up to the concurrency limit (docs/design-rates-and-weights.md, "The body slot";
    // above the count, the permit goes back at the interval and the slot stays until the body ends).
    const { limit, bodyLimit } = lockLimits(stripeLimit, rate);
    const pollSeconds = validateWholeSeconds('pollInterval', props.pollInterval ?? Duration.seconds(3), 1);
    const leaseSeconds = props.leaseDuration && validateWholeSeconds('leaseDuration', props.leaseDuration, 1);
    if (rate && leaseSeconds !== undefined && leaseSeconds < rate.intervalSeconds) {
      throw new Error(
        `\`leaseDuration\` (${props.leaseDuration!.toHumanString()}) must be at least the \`rateLimit\` interval (${rate.interval.toHumanString()}): ` +
          'an expired lease frees the permit, and the rate needs every permit held for the interval',
      );
    }
    if (props.reconcileEvery) {
      validateWholeSeconds('reconcileEvery', props.reconcileEvery, 60);
    }
    if (props.leaseDuration && props.reconcilerScheduleEnabled === false) {
      Annotations.of(this).addWarning('leaseDuration is set but the reconciler schedule is disabled: leases are enforced only by on-demand sweeps');
    }
    const waitStrategy = props.waitStrategy ?? WaitStrategy.QUEUE;
    const queueCheckInterval = props.queueCheckInterval ?? Duration.minutes(5);
    validateWholeSeconds('queueCheckInterval', queueCheckInterval, 1);
    if (props.queueCheckInterval && waitStrategy !== WaitStrategy.QUEUE) {
      Annotations.of(this).addWarning('queueCheckInterval is set but waitStrategy is not QUEUE: it has no effect');
    }
    const polling = waitStrategy === WaitStrategy.POLLING;
    // With a rate, what the lock must pass on is the rate, not the holders' count over the bodies' length.
    const highLimit = rate !== undefined
      ? highRateWarning(rate.count, rate.intervalSeconds, bodyLimit, polling)
      : highLimitWarning(limit, lockStripes, lockStripesConflict(stripeConflicts)?.[0], polling);
    if (highLimit) {
      Annotations.of(this).addWarningV2(polling ? 'cdk-sfn-semaphore:highPollingLimit' : 'cdk-sfn-semaphore:highQueueLimit', highLimit);
    }
    if (props.permitPath !== undefined) {
      validatePermitPath('permitPath', props.permitPath);
    }
    if (props.acquireTimeout && props.timeout && props.acquireTimeout.toMilliseconds() >= props.timeout.toMilliseconds()) {
      Annotations.of(this).addWarning(
        `acquireTimeout (${props.acquireTimeout.toHumanString()}) is not shorter than the state machine timeout (${props.timeout.toHumanString()}): executions will time out before they give up waiting`,
      );
    }

    this.table = props.table ?? new SemaphoreTable(this, 'LockTable');

    // An idempotent workflow describes its own executions (the owners of records), so its name must
    // be known before the state machine exists.
    const stateMachineName = props.stateMachineName ?? (props.idempotency ? defaultStateMachineName(this) : undefined);
    // The waits' history budget (see history-budget.ts): a duplicate's wait may spend half of it, and
    // the semaphore's wait what the duplicate's leaves.
    const idempotency =
      props.idempotency && renderIdempotency(this, props.idempotency, stateMachineName!, props.timeout, WAIT_HISTORY_EVENTS / 2);
    this.idempotencyTable = idempotency?.table;
    // The wait for a body slot has a share of its own (it comes after the wait for the permit).
    const slotEvents = bodyLimit === undefined ? 0 : BODY_SLOT_WAIT_EVENTS;
    const waitEvents = WAIT_HISTORY_EVENTS - slotEvents - (idempotency ? idempotency.maxWaits * DUPLICATE_CHECK_EVENTS : 0);
    const roundSeconds = waitStrategy === WaitStrategy.QUEUE ? validateWholeSeconds('queueCheckInterval', queueCheckInterval, 1) : pollSeconds;
    const rounds = roundsWithin(waitEvents, waitStrategy === WaitStrategy.QUEUE ? QUEUE_CHECK_ROUND_EVENTS : POLL_ROUND_EVENTS);
    this.longestWait = roundSeconds === undefined ? undefined : Duration.seconds(rounds * roundSeconds);
    if (waitStrategy === WaitStrategy.POLLING && roundSeconds === undefined && props.acquireTimeout === undefined) {
      throw new Error(
        '`pollInterval` is a token: the longest polling wait the history budget holds cannot be computed at synth; set `acquireTimeout` ' +
          `(at most ${roundsWithin(waitEvents, POLL_ROUND_EVENTS)} times the interval)`,
      );
    }
    const acquireTimeoutSeconds = props.acquireTimeout && validateWholeSeconds('acquireTimeout', props.acquireTimeout, 1);
    if (acquireTimeoutSeconds !== undefined && roundSeconds !== undefined && acquireTimeoutSeconds > rounds * roundSeconds) {
      const interval = waitStrategy === WaitStrategy.QUEUE ? 'queueCheckInterval' : 'pollInterval';
      const longest = humanSeconds(rounds * roundSeconds);
      throw new Error(
        `\`acquireTimeout\` (${humanSeconds(acquireTimeoutSeconds)}) is longer than a wait can last: ${rounds} rounds of \`${interval}\` ` +
          `(${humanSeconds(roundSeconds)}), ${longest}, fit in the ${waitEvents} history events the wait may spend ` +
          `(Step Functions fails an execution at 25,000 events): make it at most ${longest}, or \`${interval}\` longer`,
      );
    }

    const spec: DefinitionSpec = {
      body: props.body,
      lockName: stringValue('lockName', this.lockName),
      limit: numberValue('concurrencyLimit', limit),
      pollInterval: props.pollInterval ?? Duration.seconds(3),
      pollSeconds,
      // Polling always has the timer: its rounds take at least `pollInterval` each, so a time bounds them.
      acquireTimeout: props.acquireTimeout ?? (waitStrategy === WaitStrategy.POLLING ? this.longestWait : undefined),
      waitEvents,
      leaseSeconds,
      idempotency: idempotency?.states,
      waitStrategy,
      queueCheckInterval,
      permitPath: props.permitPath,
      holdSeconds: rate?.intervalSeconds,
      // A rate alone, or a concurrency limit above its count: the permit goes back at the interval, beside the body.
      releaseAtInterval: rate !== undefined && (props.concurrencyLimit === undefined || props.concurrencyLimit > rate.count),
      permits: weighted ? permits : undefined,
      bodyLimit,
      bodySlotRounds: bodyLimit === undefined ? undefined : Math.floor(slotEvents / BODY_SLOT_ROUND_EVENTS),
      lockStripes,
    };
    const definition = renderDefinition(this, this.table, spec);

    const logOptions = stateMachineLogs(this, props.logs);
    this.stateMachine = new sfn.StateMachine(this, 'StateMachine', {
      definitionBody: sfn.DefinitionBody.fromChainable(definition),
      stateMachineName,
      stateMachineType: sfn.StateMachineType.STANDARD,
      timeout: props.timeout,
      logs: logOptions,
      tracingEnabled: props.tracingEnabled ?? true,
      role: props.role,
      removalPolicy: props.removalPolicy,
      comment: props.comment ?? 'Runs its body while holding a permit of a DynamoDB semaphore (cdk-sfn-semaphore)',
    });
    // The tasks grant their DynamoDB actions; the key of a customer-managed-key table they leave out.
    this.table.table.encryptionKey?.grantEncryptDecrypt(this.stateMachine);
    this.idempotencyTable?.table.encryptionKey?.grantEncryptDecrypt(this.stateMachine);
    // Its executions wait in the lock's queue: releases of every workflow sharing the table may wake them.
    if (waitStrategy === WaitStrategy.QUEUE) {
      registerWaiter(this.table, this.stateMachine);
    }
    // Its release hands the permit on and wakes the waiter, of any queue workflow using the table.
    grantWakeToRole(this.table, this, 'WakeWaitersPolicy', this.stateMachine.role, WAKE_ACTIONS);

    this.cleanup = new CleanFromIncomplete(this, 'Cleanup', {
      table: this.table,
      lockName: this.lockName,
      protectedStateMachines: [this.stateMachine],
      tracingEnabled: props.tracingEnabled,
      holdAfterStop: rate?.interval,
      weightedPermits: weighted,
      lockStripes,
    });
    this.cleanupStateMachine = this.cleanup.stateMachine;
    this.cleanupRule = this.cleanup.rule;

    this.reconciler = new SemaphoreReconciler(this, 'Reconciler', {
      table: this.table,
      stateMachines: [this.stateMachine],
      schedule: props.reconcileEvery,
      scheduleEnabled: props.reconcilerScheduleEnabled,
      runtime: validateFunctionRuntime('reconcilerRuntime', props.reconcilerRuntime),
      lockName: this.lockName,
      concurrencyLimit: limit,
      permits: weighted ? props.permits : undefined,
      leaseDuration: props.leaseDuration,
      holdAfterStop: rate?.interval,
      lockStripes,
    });

    this.logGroup = logOptions.destination;
    this.metricsNamespace = `CdkSfnSemaphore/${this.stateMachine.stateMachineName}`;
    if ((logOptions.level ?? sfn.LogLevel.ERROR) !== sfn.LogLevel.ALL) {
      Annotations.of(this).addWarning(
        'the state machine does not log at level ALL: metricAcquisitions(), metricWaits(), metricBodySlotWaits() and metricAcquireTimeouts() will stay empty',
      );
    }
    this.addMetricFilters(bodyLimit !== undefined, firstWaitOutsideParallel(spec));
    if (props.dashboard) {
      this.addDashboard(rate !== undefined, bodyLimit !== undefined);
    }
  }

  /**
   * Grant the principal permission to start executions.
   */
  public grantStartExecution(grantee: iam.IGrantable): iam.Grant {
    return this.stateMachine.grantStartExecution(grantee);
  }

  /**
   * Grant the principal permission to read the state machine and its executions.
   */
  public grantRead(grantee: iam.IGrantable): iam.Grant {
    return this.stateMachine.grantRead(grantee);
  }

  /**
   * Grant the principal permission to send task responses (for callback tasks in the body).
   */
  public grantTaskResponse(grantee: iam.IGrantable): iam.Grant {
    return this.stateMachine.grantTaskResponse(grantee);
  }

  /**
   * Grant the principal the given actions on executions of the state machine.
   */
  public grantExecution(grantee: iam.IGrantable, ...actions: string[]): iam.Grant {
    return this.stateMachine.grantExecution(grantee, ...actions);
  }

  /**
   * Grant the principal the given actions on the state machine.
   */
  public grant(grantee: iam.IGrantable, ...actions: string[]): iam.Grant {
    return this.stateMachine.grant(grantee, ...actions);
  }

  /**
   * Any metric of the state machine (`AWS/States` namespace).
   */
  public metric(metricName: string, props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.stateMachine.metric(metricName, props);
  }

  /**
   * Executions started.
   */
  public metricStarted(props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.stateMachine.metricStarted(props);
  }

  /**
   * Executions that succeeded.
   */
  public metricSucceeded(props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.stateMachine.metricSucceeded(props);
  }

  /**
   * Executions that failed.
   */
  public metricFailed(props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.stateMachine.metricFailed(props);
  }

  /**
   * Executions that were stopped.
   */
  public metricAborted(props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.stateMachine.metricAborted(props);
  }

  /**
   * Executions that timed out.
   */
  public metricTimedOut(props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.stateMachine.metricTimedOut(props);
  }

  /**
   * Executions that were throttled by Step Functions.
   */
  public metricThrottled(props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.stateMachine.metricThrottled(props);
  }

  /**
   * Execution run time, waiting for a permit included.
   */
  public metricTime(props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.stateMachine.metricTime(props);
  }

  /**
   * Executions that got a permit (entered the protected body), from the state machine's log.
   */
  public metricAcquisitions(props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.logMetric('Acquisitions', props);
  }

  /**
   * Executions that found the lock full and had to wait, from the state machine's log: every wait for a
   * permit, whatever holds the permits. With a `rateLimit`, the reconciler's
   * `metricWaitingForRate(lockName)` tells how many of the queued executions the rate keeps waiting
   * (and `metricPermitsHeldForRate(lockName)` the permits it holds); with a `concurrencyLimit` below
   * the rate's count, `metricBodySlotWaits()` counts the waits for the concurrency limit, which come
   * after the permit.
   */
  public metricWaits(props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.logMetric('Waits', props);
  }

  /**
   * Executions that held a permit but found every body slot taken and had to wait for one, from the
   * state machine's log: with a `rateLimit` and a `concurrencyLimit` other than its count, the waits
   * caused by the concurrency limit (see `metricWaits()`). No data on any other workflow, which has no body
   * slots (and no metric filter for them).
   */
  public metricBodySlotWaits(props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.logMetric('BodySlotWaits', props);
  }

  /**
   * Executions that failed with `SemaphoreAcquireTimeout`, from the state machine's log.
   */
  public metricAcquireTimeouts(props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.logMetric('AcquireTimeouts', props);
  }

  private logMetric(metricName: string, props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return new cloudwatch.Metric({ namespace: this.metricsNamespace, metricName, statistic: 'Sum', ...props });
  }

  /**
   * Metric filters on the state machine's log (level ALL): its state-entered and execution-failed
   * events name the state and the error, which is all these metrics need.
   */
  private addMetricFilters(withBodySlots: boolean, firstWaitFlat: boolean): void {
    const filters: Record<string, logs.IFilterPattern> = {
      Acquisitions: logs.FilterPattern.all(
        logs.FilterPattern.stringValue('$.type', '=', 'ParallelStateEntered'),
        logs.FilterPattern.stringValue('$.details.name', '=', STATE.runBody),
      ),
      // A wait starts in "Take Ticket" where it runs outside the Parallel (which it enters only when its first wait ends otherwise).
      Waits: firstWaitFlat
        ? logs.FilterPattern.all(
          logs.FilterPattern.stringValue('$.type', '=', 'TaskStateEntered'),
          logs.FilterPattern.stringValue('$.details.name', '=', STATE.takeTicket),
        )
        : logs.FilterPattern.all(
          logs.FilterPattern.stringValue('$.type', '=', 'ParallelStateEntered'),
          logs.FilterPattern.stringValue('$.details.name', '=', STATE.waitForPermit),
        ),
      AcquireTimeouts: logs.FilterPattern.all(
        logs.FilterPattern.stringValue('$.type', '=', 'ExecutionFailed'),
        logs.FilterPattern.stringValue('$.details.error', '=', ConcurrencyControlledWorkflow.ACQUIRE_TIMEOUT_ERROR),
      ),
      // A retry of the Parallel (a round of the wait) logs ParallelStateStarted, not Entered: one per wait.
      ...(withBodySlots
        ? {
          BodySlotWaits: logs.FilterPattern.all(
            logs.FilterPattern.stringValue('$.type', '=', 'ParallelStateEntered'),
            logs.FilterPattern.stringValue('$.details.name', '=', STATE.waitForBodySlot),
          ),
        }
        : {}),
    };
    for (const [metricName, filterPattern] of Object.entries(filters)) {
      new logs.MetricFilter(this, `${metricName}Filter`, {
        logGroup: this.logGroup,
        filterPattern,
        metricNamespace: this.metricsNamespace,
        metricName,
        metricValue: '1',
      });
    }
  }

  /** A lock's metric; for a split lock, the sum of its stripes' (metric math). */
  private overStripes(lockName: string, label: string, metric: (lockName: string) => cloudwatch.Metric): cloudwatch.IMetric {
    if (this.lockStripes === 1) return metric(lockName);
    const usingMetrics: Record<string, cloudwatch.IMetric> = {};
    // Ids unique within the graph: the label's initial and the stripe (`p0`, `h0`, `q0`).
    for (let stripe = 0; stripe < this.lockStripes; stripe++) usingMetrics[`${label[0].toLowerCase()}${stripe}`] = metric(lockStripeName(lockName, stripe));
    return new cloudwatch.MathExpression({
      expression: `SUM([${Object.keys(usingMetrics).join(',')}])`,
      usingMetrics,
      label: `${label} (${this.lockStripes} stripes)`,
      period: metric(lockName).period,
    });
  }

  private addDashboard(withRate: boolean, withBodySlots: boolean): void {
    const lockName = stringValue('lockName', this.lockName).fixed;
    new cloudwatch.Dashboard(this, 'Dashboard', {
      widgets: [
        [
          new cloudwatch.GraphWidget({
            title: 'Executions',
            left: [this.metricStarted(), this.metricSucceeded(), this.metricFailed(), this.metricAborted(), this.metricTimedOut()],
          }),
          new cloudwatch.GraphWidget({
            title: 'Permits',
            left: [
              this.metricAcquisitions(),
              this.metricWaits(),
              ...(withBodySlots ? [this.metricBodySlotWaits()] : []),
              this.metricAcquireTimeouts(),
            ],
            right: [
              this.reconciler.metricPermitsReclaimed(),
              ...(lockName === undefined
                ? []
                : [
                  this.overStripes(lockName, 'PermitsInUse', (name) => this.reconciler.metricPermitsInUse(name)),
                  this.overStripes(lockName, 'Holders', (name) => this.reconciler.metricHolders(name)),
                  this.overStripes(lockName, 'Queued', (name) => this.reconciler.metricQueued(name)),
                  ...(withRate ? [this.reconciler.metricPermitsHeldForRate(lockName), this.reconciler.metricWaitingForRate(lockName)] : []),
                ]),
            ],
          }),
        ],
      ],
    });
  }
}

/** The construct path, or a unique name of the right length when the path is too long. */
function defaultLockName(scope: Construct, maxLength: number): string {
  const path = scope.node.path;
  return path.length <= maxLength ? path : Names.uniqueResourceName(scope, { maxLength });
}

/**
 * The lock's permits, and its body slots: under a rate limit the permits are the rate's count (each
 * held for at least the rate's interval), and a concurrency limit other than the count becomes body slots
 * (below it, a body holds its permit and a slot; above it, its slot, and its permit for the interval).
 */
function lockLimits(concurrencyLimit: number | undefined, rate: RateLimit | undefined): { limit: number; bodyLimit?: number } {
  if (!rate) return { limit: concurrencyLimit ?? 1 };
  if (concurrencyLimit === undefined) return { limit: rate.count };
  if (Token.isUnresolved(concurrencyLimit) || Token.isUnresolved(rate.count)) {
    throw new Error(
      '`concurrencyLimit` and `rateLimit` must both be known at synth when both are set (a concurrency limit other than the rate\'s count becomes body slots), ' +
        `got: ${Token.isUnresolved(concurrencyLimit) ? 'a concurrencyLimit read at run time' : 'a rateLimit count that is a token'}`,
    );
  }
  // Above the count, the lock item holds an entry per body slot (of no permit, past its interval) beside
  // an entry per permit: they must fit in it as the concurrency limit's entries do.
  if (concurrencyLimit > rate.count && concurrencyLimit + rate.count > MAX_CONCURRENCY_LIMIT) {
    throw new Error(
      `\`concurrencyLimit\` (${concurrencyLimit}) plus the \`rateLimit\` count (${rate.count}) must be at most ${MAX_CONCURRENCY_LIMIT} when the limit is above ` +
        'the count: the lock item keeps an entry for each body in its slot and for each permit of the rate',
    );
  }
  return { limit: rate.count, bodyLimit: concurrencyLimit !== rate.count ? concurrencyLimit : undefined };
}
