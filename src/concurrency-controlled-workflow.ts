import { Annotations, Duration, Names, RemovalPolicy } from 'aws-cdk-lib';
import * as cloudwatch from 'aws-cdk-lib/aws-cloudwatch';
import * as events from 'aws-cdk-lib/aws-events';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as logs from 'aws-cdk-lib/aws-logs';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { Construct } from 'constructs';
import { CleanFromIncomplete } from './clean-from-incomplete';
import { IdempotencyOptions } from './idempotency-options';
import { IIdempotencyTable } from './idempotency-table';
import { CONDITIONAL_CHECK_FAILED, SERVER_ERRORS, THROTTLING_ERRORS, transientRetry, VALIDATION_ERROR } from './private/dynamodb-errors';
import { defaultStateMachineName, renderIdempotency } from './private/idempotency-config';
import {
  ERROR_PATH as IDEMPOTENT_ERROR_PATH,
  IdempotencyStates,
  INPUT_PATH as IDEMPOTENT_INPUT_PATH,
  OUTPUT_PATH as IDEMPOTENT_OUTPUT_PATH,
} from './private/idempotency-states';
import { MAX_LOCK_NAME_LENGTH } from './private/lock-schema';
import { acquireTask, LockTaskProps } from './private/lock-tasks';
import {
  ENQUEUE_REFUSED,
  ENQUEUE_UNCERTAIN,
  WAIT_TIMED_OUT,
  fencingTokenTask,
  HANDOFF_PATH,
  handOffChain,
  renewWaitTask,
  waitInQueueTask,
} from './private/queue-states';
import { numberValue, pathFromExecutionInput, RuntimeValue, stringValue } from './private/runtime-value';
import { stateMachineLogs } from './private/state-machine-defaults';
import { STATE } from './private/state-names';
import { validateConcurrencyLimit, validateLockName, validatePermitPath, validateWholeSeconds } from './private/validation';
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
   * How many executions may hold a permit of the lock at the same time.
   *
   * A `JsonPath.numberAt('$.path')` reads it from each execution's input. Each acquire compares the
   * permits in use with its own limit, so workflows sharing a lock should agree on it.
   *
   * @default 1
   */
  readonly concurrencyLimit?: number;

  /**
   * The table holding the lock.
   *
   * @default - a new `SemaphoreTable`
   */
  readonly table?: ISemaphoreTable;

  /**
   * How an execution that finds the lock full waits for a permit.
   *
   * With `QUEUE`, it joins a first-in, first-out queue of waiters kept in the lock item and sleeps in
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
   * sleeps again in its place in the queue: the check and the new sleep are one write, so each
   * interval a wait outlasts costs one transition and one write. Whole seconds, at least 1 second.
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
   * @default Duration.seconds(3)
   */
  readonly pollInterval?: Duration;

  /**
   * How long an execution waits for a permit before it fails with the error `SemaphoreAcquireTimeout`.
   *
   * Whole seconds, at least 1 second.
   *
   * @default - wait for as long as the execution may run
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
   * lease is enforced when the reconciler runs, so up to `reconcileEvery` late.
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
   * Whether to create a CloudWatch dashboard of the workflow: executions, acquisitions, waits,
   * acquire timeouts, permits in use and permits reclaimed.
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
  public static readonly ACQUIRE_TIMEOUT_ERROR = 'SemaphoreAcquireTimeout';

  /**
   * Error of an execution whose `concurrencyLimit`, read from its input, is not a number of at least 1.
   */
  public static readonly INVALID_LIMIT_ERROR = 'SemaphoreInvalidLimit';

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
    this.lockName = props.lockName ?? defaultLockName(this);
    validateLockName(this.lockName);
    const limit = props.concurrencyLimit ?? 1;
    validateConcurrencyLimit(limit);
    const pollSeconds = validateWholeSeconds('pollInterval', props.pollInterval ?? Duration.seconds(3), 1);
    const leaseSeconds = props.leaseDuration && validateWholeSeconds('leaseDuration', props.leaseDuration, 1);
    if (props.reconcileEvery) {
      validateWholeSeconds('reconcileEvery', props.reconcileEvery, 60);
    }
    if (props.leaseDuration && props.reconcilerScheduleEnabled === false) {
      Annotations.of(this).addWarning('leaseDuration is set but the reconciler schedule is disabled: leases are enforced only by on-demand sweeps');
    }
    if (props.acquireTimeout) {
      validateWholeSeconds('acquireTimeout', props.acquireTimeout, 1);
    }
    const waitStrategy = props.waitStrategy ?? WaitStrategy.QUEUE;
    const queueCheckInterval = props.queueCheckInterval ?? Duration.minutes(5);
    validateWholeSeconds('queueCheckInterval', queueCheckInterval, 1);
    if (props.queueCheckInterval && waitStrategy !== WaitStrategy.QUEUE) {
      Annotations.of(this).addWarning('queueCheckInterval is set but waitStrategy is not QUEUE: it has no effect');
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
    const idempotency = props.idempotency && renderIdempotency(this, props.idempotency, stateMachineName!, props.timeout);
    this.idempotencyTable = idempotency?.table;

    const definition = this.renderDefinition({
      body: props.body,
      lockName: stringValue('lockName', this.lockName),
      limit: numberValue('concurrencyLimit', limit),
      pollInterval: props.pollInterval ?? Duration.seconds(3),
      pollSeconds,
      acquireTimeout: props.acquireTimeout,
      leaseSeconds,
      idempotency: idempotency?.states,
      waitStrategy,
      queueCheckInterval,
      permitPath: props.permitPath,
    });

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

    this.cleanup = new CleanFromIncomplete(this, 'Cleanup', {
      table: this.table,
      lockName: this.lockName,
      protectedStateMachines: [this.stateMachine],
      tracingEnabled: props.tracingEnabled,
    });
    this.cleanupStateMachine = this.cleanup.stateMachine;
    this.cleanupRule = this.cleanup.rule;

    this.reconciler = new SemaphoreReconciler(this, 'Reconciler', {
      table: this.table,
      stateMachines: [this.stateMachine],
      schedule: props.reconcileEvery,
      scheduleEnabled: props.reconcilerScheduleEnabled,
      lockName: this.lockName,
      concurrencyLimit: limit,
      leaseDuration: props.leaseDuration,
    });

    this.logGroup = logOptions.destination;
    this.metricsNamespace = `CdkSfnSemaphore/${this.stateMachine.stateMachineName}`;
    if ((logOptions.level ?? sfn.LogLevel.ERROR) !== sfn.LogLevel.ALL) {
      Annotations.of(this).addWarning(
        'the state machine does not log at level ALL: metricAcquisitions(), metricWaits() and metricAcquireTimeouts() will stay empty',
      );
    }
    this.addMetricFilters();
    if (props.dashboard) {
      this.addDashboard();
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
   * Executions that found the lock full and had to wait, from the state machine's log.
   */
  public metricWaits(props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.logMetric('Waits', props);
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
  private addMetricFilters(): void {
    const filters: Record<string, logs.IFilterPattern> = {
      Acquisitions: logs.FilterPattern.all(
        logs.FilterPattern.stringValue('$.type', '=', 'ParallelStateEntered'),
        logs.FilterPattern.stringValue('$.details.name', '=', STATE.runBody),
      ),
      Waits: logs.FilterPattern.all(
        logs.FilterPattern.stringValue('$.type', '=', 'ParallelStateEntered'),
        logs.FilterPattern.stringValue('$.details.name', '=', STATE.waitForPermit),
      ),
      AcquireTimeouts: logs.FilterPattern.all(
        logs.FilterPattern.stringValue('$.type', '=', 'ExecutionFailed'),
        logs.FilterPattern.stringValue('$.details.error', '=', ConcurrencyControlledWorkflow.ACQUIRE_TIMEOUT_ERROR),
      ),
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

  private addDashboard(): void {
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
            left: [this.metricAcquisitions(), this.metricWaits(), this.metricAcquireTimeouts()],
            right: [
              this.reconciler.metricPermitsReclaimed(),
              ...(lockName === undefined ? [] : [this.reconciler.metricPermitsInUse(lockName)]),
            ],
          }),
        ],
      ],
    });
  }

  /**
   * The definition:
   *
   *   Acquire Permit ──ok──▶ Run Protected Body ──ok──▶ Release Permit (hands off to a waiter if any)
   *     │ lock full                │ error                  (body output is the execution output)
   *     ▼                          ▼
   *   Wait In Queue ──▶ …        Prepare Release After Failure ──▶ Release Permit After Failure ──▶ Fail
   *   (or Wait For Permit: polling)
   *
   * The uncontended path is three transitions and two writes. A waiter adds one transition and one
   * write (the enqueue); a release that hands off adds three transitions, two writes and a call.
   */
  private renderDefinition(spec: DefinitionSpec): sfn.IChainable {
    const lockName = tasks.DynamoAttributeValue.fromString(
      spec.lockName.inputPath === undefined ? spec.lockName.fixed! : sfn.JsonPath.stringAt(pathFromExecutionInput(spec.lockName.inputPath)),
    );
    const lockTask: LockTaskProps = { table: this.table, lockName, holder: sfn.JsonPath.stringAt('$$.Execution.Id') };
    const limit =
      spec.limit.inputPath === undefined
        ? tasks.DynamoAttributeValue.fromNumber(spec.limit.fixed!)
        : tasks.DynamoAttributeValue.numberFromString(
          sfn.JsonPath.format('{}', sfn.JsonPath.stringAt(pathFromExecutionInput(spec.limit.inputPath))),
        );
    // With idempotency, the state data is the key function's result: the input at `$.payload`, which
    // the body's output replaces, an error at `$.error`; the record is completed after the release.
    const idem = spec.idempotency;
    const errorPath = idem ? IDEMPOTENT_ERROR_PATH : '$';
    // Where the body finds `{ fencingToken }`, in the state data before the body.
    const permitPath = spec.permitPath && (idem ? `${IDEMPOTENT_INPUT_PATH}${spec.permitPath.slice(1)}` : spec.permitPath);
    // The release reads its holder and run from the state data, so that it can also give back the
    // permit of a waiter it could not wake.
    const holderOfThisRun = {
      holder: sfn.JsonPath.stringAt('$$.Execution.Id'),
      redriveCount: sfn.JsonPath.numberAt('$$.Execution.RedriveCount'),
    };

    // Failure path: give the permit back if we hold it, then fail with the error that brought us here.
    const failWithError = idem ? idem.markFailed : new sfn.Fail(this, STATE.failWithError, { errorPath: '$.Error', causePath: '$.Cause' });
    const releaseAfterFailure = new sfn.Pass(this, STATE.prepareReleaseAfterFailure, { parameters: holderOfThisRun, resultPath: HANDOFF_PATH });
    releaseAfterFailure.next(handOffChain(this, { table: this.table, lockName, suffix: ' After Failure', next: failWithError }));

    // Success path. The Parallel wraps the body's output in an array: `$[0]` unwraps it.
    let runBody: sfn.Parallel;
    if (idem) {
      runBody = new sfn.Parallel(this, STATE.runBody, { inputPath: IDEMPOTENT_INPUT_PATH, resultPath: IDEMPOTENT_OUTPUT_PATH });
      runBody.next(
        new sfn.Pass(this, STATE.prepareRelease, { parameters: holderOfThisRun, resultPath: HANDOFF_PATH }).next(
          handOffChain(this, { table: this.table, lockName, suffix: '', next: idem.saveResult, alreadyReleased: idem.saveResult }),
        ),
      );
    } else {
      // The output and the release's holder in one object, without a state of its own.
      runBody = new sfn.Parallel(this, STATE.runBody, {
        resultSelector: { output: sfn.JsonPath.objectAt('$[0]'), handoff: holderOfThisRun },
      });
      runBody.next(handOffChain(this, { table: this.table, lockName, suffix: '', outputPath: '$.output' }));
    }
    runBody
      .branch(spec.body)
      // resultPath '$': the failure path needs only the error, and the lock name comes from the context.
      .addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath });

    // A permit taken inside a Parallel (whose result is discarded) reads its fencing token after it.
    // (Only where a Parallel takes the permit: polling, or the queue with an acquire timeout.)
    let toBody: sfn.State = runBody;
    if (permitPath && (spec.waitStrategy === WaitStrategy.POLLING || spec.acquireTimeout !== undefined)) {
      toBody = fencingTokenTask(this, STATE.readFencingToken, { table: this.table, lockName, permitPath }).addCatch(releaseAfterFailure, {
        errors: [sfn.Errors.ALL],
        resultPath: errorPath,
      });
      (toBody as sfn.TaskStateBase).next(runBody);
    }

    let waitForPermit: sfn.State;
    if (spec.waitStrategy === WaitStrategy.QUEUE) {
      waitForPermit = this.renderQueueWait(spec, lockTask, limit, runBody, toBody, releaseAfterFailure, errorPath, permitPath);
    } else {
      const polling = this.renderWaitForPermit(spec, lockTask, limit, toBody);
      polling.addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath });
      polling.next(toBody);
      waitForPermit = polling;
    }

    // The acquire found this execution's own entry (see ACQUIRE_CONDITION): a permit it holds already,
    // taken by a write of its stopped run that landed late, or by a write whose response was lost.
    // It claims that permit for its current run; if it was freed meanwhile, it waits for one.
    const claimOwn = fencingTokenTask(this, STATE.claimOwnPermit, { table: this.table, lockName, permitPath })
      .addCatch(waitForPermit, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
      .addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath })
      .next(runBody);

    // A server error leaves it open whether the write landed: try again. If it did land, the retry
    // finds the execution's own entry, and the execution claims it.
    const acquire = acquireTask(this, STATE.acquire, { ...lockTask, limit, leaseSeconds: spec.leaseSeconds, permitPath })
      .addRetry(transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]))
      .addCatch(waitForPermit, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
      .addCatch(claimOwn, { errors: [VALIDATION_ERROR], resultPath: sfn.JsonPath.DISCARD })
      .next(runBody);
    const start = (head: sfn.IChainable) => (idem ? idem.start(head) : head);
    if (spec.limit.inputPath === undefined) {
      return start(acquire);
    }

    // A limit read from the input is checked before the first acquire: on a lock nobody holds yet the
    // condition `attribute_not_exists(permits)` would let one execution in whatever the limit, and a
    // limit below 1 would make every other execution wait forever. One more transition, only here.
    const invalidLimit = new sfn.Fail(this, STATE.runtimeLimitInvalid, {
      error: ConcurrencyControlledWorkflow.INVALID_LIMIT_ERROR,
      cause: `The concurrency limit read from the execution input at ${spec.limit.inputPath} must be a number of at least 1`,
    });
    // With idempotency too, the check comes first: an invalid input never claims a record.
    return new sfn.Choice(this, STATE.checkRuntimeLimit)
      .when(sfn.Condition.not(sfn.Condition.isPresent(spec.limit.inputPath)), invalidLimit)
      .when(sfn.Condition.not(sfn.Condition.isNumeric(spec.limit.inputPath)), invalidLimit)
      .when(sfn.Condition.numberLessThan(spec.limit.inputPath, 1), invalidLimit)
      .otherwise(start(acquire));
  }

  /**
   * The queue: "Wait In Queue" enqueues and sleeps until woken with the permit. When its wait times out
   * it sleeps again in its place, with a write that is refused if the wake-up was lost (a permit was
   * handed to it), a permit is free or its place is gone. When the queue refuses (a permit came free,
   * or the queue is full), the execution checks for a handed-off permit and tries once to take one:
   *
   *   Wait In Queue ─woken─▶ body; timed out ─▶ Wait In Queue Again
   *     │ refused
   *     ▼
   *   Check Handed-Off Permit ─yes─▶ body
   *     │ no
   *     ▼
   *   Poll For Permit ─yes─▶ body
   *     │ full
   *     ▼
   *   Wait In Queue Again (its place kept, a new token) ─woken─▶ body; timed out ─▶ itself
   *     │ refused: handed a permit (a lost wake-up), a permit free, or no place any more
   *     ▼
   *   Check Handed-Off Permit Again ─yes─▶ body
   *     │ no
   *     ▼
   *   Wait Before Next Poll ─▶ Wait In Queue
   *
   * With an `acquireTimeout`, these states run in the "Wait For Permit" Parallel beside a timer, as
   * the polling states do.
   */
  private renderQueueWait(
    spec: DefinitionSpec,
    lockTask: LockTaskProps,
    limit: tasks.DynamoAttributeValue,
    runBody: sfn.State,
    toBody: sfn.State,
    releaseAfterFailure: sfn.State,
    errorPath: string,
    permitPath: string | undefined,
  ): sfn.State {
    const inParallel = spec.acquireTimeout !== undefined;
    // In the Parallel, success ends the branch with the marker error; the fencing token is read after it.
    const acquired: sfn.State = inParallel
      ? new sfn.Fail(this, STATE.permitAcquired, { error: PERMIT_ACQUIRED, cause: 'Not an error: ends the Parallel early so that the body can start' })
      : runBody;
    const ownPermitPath = inParallel ? undefined : permitPath;
    const onError = <T extends sfn.TaskStateBase>(task: T): T =>
      (inParallel ? task : task.addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath })) as T;

    const waiter = {
      table: this.table,
      lockName: lockTask.lockName,
      limit,
      leaseSeconds: spec.leaseSeconds ?? 0,
      checkInterval: spec.queueCheckInterval,
      permitPath: ownPermitPath,
    };
    const waitInQueue = waitInQueueTask(this, waiter);
    const waitAgain = renewWaitTask(this, waiter);
    const nextWait = new sfn.Wait(this, STATE.nextWait, { time: sfn.WaitTime.duration(spec.pollInterval) }).next(waitInQueue);
    const checkProps = { table: this.table, lockName: lockTask.lockName, permitPath: ownPermitPath };
    // Found the execution's own entry (handed to it meanwhile, or taken by a write of an earlier run):
    // claim it; if it went meanwhile, queue anew after a pause.
    const checkAgain = fencingTokenTask(this, STATE.checkHandedOffAgain, checkProps)
      .addCatch(nextWait, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
    onError(checkAgain).next(acquired);
    // Server errors are retried: a write that landed makes the retry find the execution's own entry.
    const poll = acquireTask(this, STATE.poll, { ...lockTask, limit, leaseSeconds: spec.leaseSeconds, permitPath: ownPermitPath, asWaiter: true })
      .addRetry(transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]))
      .addCatch(waitAgain, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
      .addCatch(checkAgain, { errors: [VALIDATION_ERROR], resultPath: sfn.JsonPath.DISCARD });
    onError(poll).next(acquired);
    const check = fencingTokenTask(this, STATE.checkHandedOff, checkProps)
      .addCatch(poll, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
    onError(check).next(acquired);
    // Timed out (no wake-up within the check interval): sleep again in place, a write whose condition
    // is the whole check (no permit handed over, none free, the entry still there).
    waitInQueue.addCatch(waitAgain, { errors: WAIT_TIMED_OUT, resultPath: sfn.JsonPath.DISCARD });
    // Refused: the lock has a free permit, the queue is full, or this execution already holds a
    // permit (handed over while it was not waiting: after a lost wake-up, or to an older entry of it).
    waitInQueue.addCatch(check, { errors: [...ENQUEUE_REFUSED, ...ENQUEUE_UNCERTAIN], resultPath: sfn.JsonPath.DISCARD });
    onError(waitInQueue).next(acquired);
    // Refused: a permit was handed to it (its wake-up was lost), or its entry is gone (dropped, or
    // served and taken back), or a permit is free. Check for a handed-off permit, then queue anew after
    // a pause that keeps a full queue from becoming a busy loop (the enqueue takes a free permit's
    // refusal to the poll).
    waitAgain.addCatch(waitAgain, { errors: WAIT_TIMED_OUT, resultPath: sfn.JsonPath.DISCARD });
    waitAgain.addCatch(checkAgain, { errors: ENQUEUE_REFUSED, resultPath: sfn.JsonPath.DISCARD });
    waitAgain.addCatch(check, { errors: ENQUEUE_UNCERTAIN, resultPath: sfn.JsonPath.DISCARD });
    onError(waitAgain).next(acquired);

    if (!inParallel) {
      return waitInQueue;
    }
    const timer = new sfn.Wait(this, STATE.acquireTimer, { time: sfn.WaitTime.duration(spec.acquireTimeout!) }).next(
      new sfn.Fail(this, STATE.acquireTimedOut, {
        error: ConcurrencyControlledWorkflow.ACQUIRE_TIMEOUT_ERROR,
        cause: `No permit became free within the acquire timeout of ${spec.acquireTimeout!.toHumanString()}`,
      }),
    );
    return new sfn.Parallel(this, STATE.waitForPermit, { resultPath: sfn.JsonPath.DISCARD })
      .branch(waitInQueue, timer)
      .addCatch(toBody, { errors: [PERMIT_ACQUIRED], resultPath: sfn.JsonPath.DISCARD })
      .addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: errorPath });
  }

  /**
   * The polling wait, a Parallel whose result is discarded:
   *
   *   Draw Poll Delay → Wait Before First Poll → Poll For Permit ⇄ Wait Before Next Poll
   *
   * With an `acquireTimeout`, a second branch waits that long and fails with `SemaphoreAcquireTimeout`;
   * a Parallel ends early only when a branch fails, so the polling branch then ends with the marker
   * error `SemaphorePermitAcquired`, which the Parallel's first catch turns into "go to the body".
   */
  private renderWaitForPermit(
    spec: DefinitionSpec,
    lockTask: LockTaskProps,
    limit: tasks.DynamoAttributeValue,
    toBody: sfn.State,
  ): sfn.Parallel {
    const waitForPermit = new sfn.Parallel(this, STATE.waitForPermit, { resultPath: sfn.JsonPath.DISCARD });

    const nextWait = new sfn.Wait(this, STATE.nextWait, { time: sfn.WaitTime.duration(spec.pollInterval) });
    // A poll refused on the execution's own entry (a permit its stopped run took, or a write whose
    // response was lost) claims it, rather than poll beside it until the execution times out.
    const claimOwn = fencingTokenTask(this, STATE.claimOwnPermitWhilePolling, { table: this.table, lockName: lockTask.lockName })
      .addCatch(nextWait, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD });
    // Server errors are retried: a write that landed makes the retry find the execution's own entry.
    const poll = acquireTask(this, STATE.poll, { ...lockTask, limit, leaseSeconds: spec.leaseSeconds })
      .addRetry(transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]))
      .addCatch(nextWait, { errors: [CONDITIONAL_CHECK_FAILED], resultPath: sfn.JsonPath.DISCARD })
      .addCatch(claimOwn, { errors: [VALIDATION_ERROR], resultPath: sfn.JsonPath.DISCARD });
    nextWait.next(poll);

    // Full jitter on the first wait spreads executions that started together over the interval.
    // States.MathRandom's end is exclusive, so this draws 1..pollInterval.
    const drawDelay = new sfn.Pass(this, STATE.drawPollDelay, {
      parameters: { delaySeconds: sfn.JsonPath.mathRandom(1, (spec.pollSeconds ?? 1) + 1) },
    });
    const firstWait = new sfn.Wait(this, STATE.firstWait, { time: sfn.WaitTime.secondsPath('$.delaySeconds') });
    const polling = sfn.Chain.start(drawDelay).next(firstWait).next(poll);

    if (spec.acquireTimeout === undefined) {
      // Without a timeout the polling branch simply ends once it holds a permit.
      return waitForPermit.branch(polling);
    }

    const acquired = new sfn.Fail(this, STATE.permitAcquired, {
      error: PERMIT_ACQUIRED,
      cause: 'Not an error: ends the Parallel early so that the body can start',
    });
    poll.next(acquired);
    claimOwn.next(acquired);
    const timer = new sfn.Wait(this, STATE.acquireTimer, { time: sfn.WaitTime.duration(spec.acquireTimeout) }).next(
      new sfn.Fail(this, STATE.acquireTimedOut, {
        error: ConcurrencyControlledWorkflow.ACQUIRE_TIMEOUT_ERROR,
        cause: `No permit became free within the acquire timeout of ${spec.acquireTimeout.toHumanString()}`,
      }),
    );
    return waitForPermit
      .branch(polling, timer)
      .addCatch(toBody, {
        errors: [PERMIT_ACQUIRED],
        resultPath: sfn.JsonPath.DISCARD,
      });
  }
}

/** Marker error that ends the "Wait For Permit" Parallel once the polling branch holds a permit. */
const PERMIT_ACQUIRED = 'SemaphorePermitAcquired';

interface DefinitionSpec {
  readonly body: sfn.IChainable;
  readonly lockName: RuntimeValue<string>;
  readonly limit: RuntimeValue<number>;
  readonly pollInterval: Duration;
  readonly pollSeconds?: number;
  readonly acquireTimeout?: Duration;
  readonly leaseSeconds?: number;
  readonly idempotency?: IdempotencyStates;
  readonly waitStrategy: WaitStrategy;
  readonly queueCheckInterval: Duration;
  readonly permitPath?: string;
}

/** The construct path, or a unique name of the right length when the path is too long. */
function defaultLockName(scope: Construct): string {
  const path = scope.node.path;
  return path.length <= MAX_LOCK_NAME_LENGTH ? path : Names.uniqueResourceName(scope, { maxLength: MAX_LOCK_NAME_LENGTH });
}
