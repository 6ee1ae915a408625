import { Duration } from 'aws-cdk-lib';
import * as cloudwatch from 'aws-cdk-lib/aws-cloudwatch';
import * as events from 'aws-cdk-lib/aws-events';
import * as targets from 'aws-cdk-lib/aws-events-targets';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as sqs from 'aws-cdk-lib/aws-sqs';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { Construct } from 'constructs';
import { executionArnPattern } from './private/arns';
import { reconcilerFunction, validateFunctionRuntime } from './private/bundled-functions';
import { defaultDeadLetterQueue } from './private/dead-letter-queue';
import { functionWithOwnLogs } from './private/function-logs';
import { numberValue, stringValue } from './private/runtime-value';
import { isLockStripeCount, knownWholeSeconds, MAX_LOCK_STRIPES, validatePermits, validateWholeSeconds } from './private/validation';
import { grantWakeToRole } from './private/wake-grants';
import { ISemaphoreTable } from './semaphore-table';

/**
 * Properties of a `SemaphoreReconciler`.
 */
export interface SemaphoreReconcilerProps {
  /**
   * The table to sweep.
   */
  readonly table: ISemaphoreTable;

  /**
   * State machines whose executions the reconciler may describe, stop and release. Holders that are
   * executions of other state machines are left to their own reconcilers.
   *
   * @default - none: only holders that are not executions (leases of scripts) are swept
   */
  readonly stateMachines?: sfn.IStateMachine[];

  /**
   * How often the sweep runs.
   *
   * @default Duration.minutes(5)
   */
  readonly schedule?: Duration;

  /**
   * Whether the sweep runs on its schedule. Without it, invoke `reconcilerFunction` on demand.
   *
   * @default true
   */
  readonly scheduleEnabled?: boolean;

  /**
   * A lease of a holder that is not an execution counts as expired only this long after its end, to
   * absorb the clock skew between the machine that took it and the reconciler.
   *
   * @default Duration.seconds(30)
   */
  readonly clockSkew?: Duration;

  /**
   * The lock the `stateMachines` take, for the redrive guard: a redriven execution that resumes inside
   * the body (its permit freed by the cleanup meanwhile) takes a permit again, or is stopped with the
   * error `SemaphoreRedriveRejected` when every permit is taken. A `JsonPath.stringAt('$.path')` reads
   * it from the execution's input.
   *
   * @default - no redrive guard
   */
  readonly lockName?: string;

  /**
   * The concurrency limit of `lockName`, for the redrive guard. A `JsonPath.numberAt('$.path')` reads
   * it from the execution's input.
   *
   * @default 1
   */
  readonly concurrencyLimit?: number;

  /**
   * How many permits of `lockName` one execution takes (its weight), for the redrive guard. A
   * `JsonPath.numberAt('$.path')` reads it from the execution's input.
   *
   * @default 1
   */
  readonly permits?: number;

  /**
   * How many stripes `lockName` is split into (the workflow's `lockStripes`), for the redrive guard: it
   * takes the permit again on the stripe the execution drew, which it reads from the output of the
   * execution's "Pick Lock Stripe" state in its history. `concurrencyLimit` is then a stripe's limit.
   *
   * @default 1 - one lock, not split
   */
  readonly lockStripes?: number;

  /**
   * The lease of a permit the redrive guard takes.
   *
   * @default - no lease
   */
  readonly leaseDuration?: Duration;

  /**
   * Namespace of the metrics the sweep publishes.
   *
   * @default 'CdkSfnSemaphore'
   */
  readonly metricsNamespace?: string;

  /**
   * Queue that receives what the reconciler could not process: redrive events EventBridge could not
   * deliver to it, and invocations that failed every attempt (Lambda tries a failed asynchronous
   * invocation three times). A message there is a redriven execution the guard could not check (the
   * next sweep checks it again) or a sweep that failed; `deadLetterAlarm` goes off.
   *
   * @default - a new queue, encrypted with SQS-managed keys, TLS enforced, messages kept 14 days
   */
  readonly deadLetterQueue?: sqs.IQueue;

  /**
   * Runtime of the reconciler's function: a Node.js runtime, `nodejs22.x` or newer. Lambda deprecates
   * `nodejs22.x` on 2027-04-30 and blocks creating functions on it from 2027-06-01; choose a newer one
   * then (`new lambda.Runtime('nodejs24.x', lambda.RuntimeFamily.NODEJS)` where aws-cdk-lib lacks
   * `Runtime.NODEJS_24_X`).
   *
   * @default lambda.Runtime.NODEJS_22_X
   */
  readonly runtime?: lambda.Runtime;

  /**
   * Free the permit of a stopped execution only so long after it stopped: the `rateLimit` interval of
   * the `stateMachines`, for which every start of their body holds the permit. A lease that expires
   * then stops the execution and leaves its permit to the cleanup or a later sweep. Whole seconds.
   *
   * @default - no wait: a stopped execution's permit is freed when the sweep finds it
   */
  readonly holdAfterStop?: Duration;
}

/**
 * The third layer of cleanup: a Lambda function that sweeps the lock table on a schedule and frees
 * the permits that no one alive holds.
 *
 * EventBridge delivers Step Functions status-change events "best effort", a cleanup execution can
 * fail, and an acquire can land after its execution was stopped. For every holder the sweep finds,
 * it releases executions that are no longer RUNNING (or do not exist), stops and then releases
 * RUNNING executions past their lease (error `SemaphoreLeaseExpired`), and releases expired leases of
 * holders that are not executions. Every release is the same conditional write as the cleanup's.
 * On a lock with a queue of waiters (wait strategy QUEUE) it then drops the entries of waiters whose
 * execution stopped and hands every free permit to the oldest waiter, waking it with SendTaskSuccess.
 *
 * It publishes, in the Embedded Metric Format, `PermitsInUse` (by weight) and `Holders` per lock and `PermitsReclaimed`,
 * `LeasesExpired` and `ReconcilerErrors` per table. A reclaimed permit means that events were lost or
 * a cleanup failed: `reclaimAlarm` goes off.
 */
export class SemaphoreReconciler extends Construct {
  /** The function that sweeps; invoke it with `{}` for an on-demand sweep, `{"dryRun": true}` to look only. */
  public readonly reconcilerFunction: lambda.Function;

  /** The schedule, unless disabled. */
  public readonly rule?: events.Rule;

  /** The rule on redriven executions, when the redrive guard is on (`lockName` given). */
  public readonly redriveRule?: events.Rule;

  /** Alarm raised when a sweep had to reclaim a permit. */
  public readonly reclaimAlarm: cloudwatch.Alarm;

  /**
   * Alarm raised when the reconciler itself fails: the function errored, or a sweep could not check
   * or release a holder. While it is on, the last layer of cleanup is not working.
   */
  public readonly failureAlarm: cloudwatch.Alarm;

  /** Where redrive events and invocations the reconciler could not process end up. */
  public readonly deadLetterQueue: sqs.IQueue;

  /**
   * Alarm raised when anything reaches `deadLetterQueue`: most urgently, a redriven execution whose
   * guard failed every attempt may run its body without a permit until the next sweep stops it or
   * takes one for it.
   */
  public readonly deadLetterAlarm: cloudwatch.Alarm;

  private readonly namespace: string;
  private readonly tableName: string;

  constructor(scope: Construct, id: string, props: SemaphoreReconcilerProps) {
    super(scope, id);
    const schedule = props.schedule ?? Duration.minutes(5);
    validateWholeSeconds('schedule', schedule, 60);
    const clockSkew = props.clockSkew ?? Duration.seconds(30);
    validateWholeSeconds('clockSkew', clockSkew, 0);
    const stripes = props.lockStripes ?? 1;
    if (!isLockStripeCount(stripes)) {
      throw new Error(`\`lockStripes\` must be an integer from 1 to ${MAX_LOCK_STRIPES}, got: ${stripes}`);
    }
    if (stripes > 1 && props.lockName === undefined) {
      throw new Error(`\`lockStripes\` (${stripes}) is the split of \`lockName\`, for the redrive guard: set \`lockName\` too`);
    }
    if (stripes > 1 && (props.permits !== undefined || props.holdAfterStop !== undefined)) {
      throw new Error(`\`lockStripes\` (${stripes}) cannot be combined with \`${props.permits !== undefined ? 'permits' : 'holdAfterStop'}\` yet. Set one of them`);
    }
    this.namespace = props.metricsNamespace ?? 'CdkSfnSemaphore';
    this.tableName = props.table.tableName;
    const stateMachines = props.stateMachines ?? [];
    const runtime = validateFunctionRuntime('runtime', props.runtime);

    const { fn, role } = functionWithOwnLogs(this, (functionRole) =>
      reconcilerFunction(this, 'Function', {
        role: functionRole,
        runtime,
        timeout: Duration.minutes(5),
        memorySize: 256,
        description: 'Frees semaphore permits that no running execution or live lease holds (cdk-sfn-semaphore)',
        environment: {
          TABLE_NAME: props.table.tableName,
          STATE_MACHINE_ARNS: stateMachines.map((sm) => sm.stateMachineArn).join(','),
          CLOCK_SKEW_SECONDS: String(clockSkew.toSeconds()),
          METRICS_NAMESPACE: this.namespace,
          ...(props.holdAfterStop ? { HOLD_AFTER_STOP_SECONDS: String(knownWholeSeconds('holdAfterStop', props.holdAfterStop, 1)) } : {}),
        },
      }),
    );
    this.reconcilerFunction = fn;
    this.deadLetterQueue = props.deadLetterQueue ?? defaultDeadLetterQueue(this);
    // EventBridge invokes the function asynchronously: Lambda, not the rule, retries a failed
    // invocation (twice, after about one and two more minutes), then sends it here.
    // https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-error-handling.html
    fn.configureAsyncInvoke({ retryAttempts: 2, onFailure: new SendOnlyQueueDestination(this.deadLetterQueue) });
    // GetItem, DeleteItem and SendTaskSuccess serve the queues of the wait strategy QUEUE: free permits
    // go to the waiter whose turn it is, which is woken, and the items of passed tickets go (see
    // client/queue-service.ts).
    props.table.table.grant(role, 'dynamodb:Scan', 'dynamodb:GetItem', 'dynamodb:UpdateItem', 'dynamodb:DeleteItem');
    props.table.table.encryptionKey?.grantEncryptDecrypt(role);
    // Waiters of a shared lock can be executions of any queue workflow using the table (wake-grants.ts).
    grantWakeToRole(props.table, this, 'WakeWaitersPolicy', role, ['states:SendTaskSuccess']);
    if (stateMachines.length > 0) {
      role.addToPrincipalPolicy(
        new iam.PolicyStatement({
          actions: ['states:DescribeExecution', 'states:StopExecution'],
          resources: stateMachines.map((sm) => executionArnPattern(this, sm)),
        }),
      );
    }

    if (props.scheduleEnabled ?? true) {
      this.rule = new events.Rule(this, 'Schedule', {
        description: 'Sweeps the semaphore table for permits that no one alive holds',
        schedule: events.Schedule.rate(schedule),
        targets: [new targets.LambdaFunction(this.reconcilerFunction, { retryAttempts: 2 })],
      });
    }

    if (props.lockName !== undefined && stateMachines.length > 0) {
      this.redriveRule = this.addRedriveGuard(props, stateMachines, role);
    }

    this.reclaimAlarm = new cloudwatch.Alarm(this, 'ReclaimAlarm', {
      alarmDescription:
        'The semaphore reconciler freed a permit that no running execution held: status-change events were lost or a cleanup failed',
      metric: this.metricPermitsReclaimed({ period: Duration.minutes(5), statistic: 'Sum' }),
      threshold: 1,
      evaluationPeriods: 1,
      comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
      treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
    });

    this.deadLetterAlarm = new cloudwatch.Alarm(this, 'DeadLetterAlarm', {
      alarmDescription:
        'The semaphore reconciler could not process an event or an invocation: a redriven execution may run its protected body without a permit until the next sweep',
      metric: this.deadLetterQueue.metricApproximateNumberOfMessagesVisible({ period: Duration.minutes(5), statistic: 'Maximum' }),
      threshold: 1,
      evaluationPeriods: 1,
      comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
      treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
    });

    this.failureAlarm = new cloudwatch.Alarm(this, 'FailureAlarm', {
      alarmDescription: 'The semaphore reconciler failed, or could not check or release a holder: leaked permits may stay held',
      metric: new cloudwatch.MathExpression({
        expression: 'FILL(invocationErrors, 0) + FILL(holderErrors, 0)',
        usingMetrics: {
          invocationErrors: this.reconcilerFunction.metricErrors({ statistic: 'Sum' }),
          holderErrors: this.metricErrors({ statistic: 'Sum' }),
        },
        period: Duration.minutes(15),
        label: 'reconciler errors',
      }),
      threshold: 1,
      evaluationPeriods: 1,
      comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
      treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
    });
  }

  private addRedriveGuard(props: SemaphoreReconcilerProps, stateMachines: sfn.IStateMachine[], role: iam.IRole): events.Rule {
    const lockName = stringValue('lockName', props.lockName!);
    const limit = numberValue('concurrencyLimit', props.concurrencyLimit ?? 1);
    const fn = this.reconcilerFunction;
    if (lockName.inputPath !== undefined) fn.addEnvironment('LOCK_NAME_PATH', lockName.inputPath);
    else fn.addEnvironment('LOCK_NAME', lockName.fixed!);
    if (limit.inputPath !== undefined) fn.addEnvironment('CONCURRENCY_LIMIT_PATH', limit.inputPath);
    else fn.addEnvironment('CONCURRENCY_LIMIT', String(limit.fixed));
    if (props.permits !== undefined) {
      validatePermits(props.permits, props.concurrencyLimit ?? 1);
      const permits = numberValue('permits', props.permits);
      if (permits.inputPath !== undefined) fn.addEnvironment('PERMITS_PATH', permits.inputPath);
      else fn.addEnvironment('PERMITS', String(permits.fixed));
    }
    const stripes = props.lockStripes ?? 1;
    if (stripes > 1) fn.addEnvironment('LOCK_STRIPES', String(stripes));
    if (props.leaseDuration) {
      fn.addEnvironment('LEASE_SECONDS', String(validateWholeSeconds('leaseDuration', props.leaseDuration, 1) ?? props.leaseDuration.toSeconds()));
    }
    role.addToPrincipalPolicy(
      new iam.PolicyStatement({
        actions: ['states:GetExecutionHistory'],
        resources: stateMachines.map((sm) => executionArnPattern(this, sm)),
      }),
    );
    // Each sweep also guards redriven executions that still run (their RUNNING event may have been lost).
    role.addToPrincipalPolicy(new iam.PolicyStatement({ actions: ['states:ListExecutions'], resources: stateMachines.map((sm) => sm.stateMachineArn) }));
    // A redrive emits a RUNNING status-change event whose redriveCount is at least 1.
    return new events.Rule(this, 'RedriveRule', {
      description: 'Takes a permit again for executions redriven inside the protected body, or stops them',
      eventPattern: {
        source: ['aws.states'],
        detailType: ['Step Functions Execution Status Change'],
        detail: {
          status: ['RUNNING'],
          stateMachineArn: stateMachines.map((sm) => sm.stateMachineArn),
          redriveCount: [{ numeric: ['>', 0] }],
        },
      },
      targets: [new targets.LambdaFunction(fn, { retryAttempts: 8, deadLetterQueue: this.deadLetterQueue })],
    });
  }

  /** Permit the principal to run a sweep on demand. */
  public grantInvoke(grantee: iam.IGrantable): iam.Grant {
    return this.reconcilerFunction.grantInvoke(grantee);
  }

  /**
   * Permits the sweeps freed (each one a lost event, a failed cleanup or a late acquire), by holder
   * entry. A waiting CLI's registration to go next that its lease ended holds no permit: not counted.
   */
  public metricPermitsReclaimed(props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.tableMetric('PermitsReclaimed', props);
  }

  /** Executions the sweeps stopped because they held a permit past their lease. */
  public metricLeasesExpired(props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.tableMetric('LeasesExpired', props);
  }

  /** Holders a sweep could not check or release. */
  public metricErrors(props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.tableMetric('ReconcilerErrors', props);
  }

  /** Permits of a lock in use, as the last sweep saw them: counted by weight (a holder of 4 counts 4). */
  public metricPermitsInUse(lockName: string, props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.lockMetric('PermitsInUse', lockName, props);
  }

  /**
   * Holders of a lock (executions and leases), as the last sweep saw them: below `PermitsInUse` by
   * the extra permits of weighted holders, above it by the bodies that keep a slot and no permit (a
   * `concurrencyLimit` above the rate's count, past their interval).
   */
  public metricHolders(lockName: string, props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.lockMetric('Holders', lockName, props);
  }

  /**
   * Tickets in a lock's queue not yet served (executions of the queue strategy and clients that wait),
   * as the last sweep read the lock item. Executions that wait by polling are in no queue.
   */
  public metricQueued(lockName: string, props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.lockMetric('Queued', lockName, props);
  }

  /**
   * On a lock with a rate (`rateLimit`): the permits the rate holds, at least, when the last sweep
   * ended: those of holders still inside their acquisition's interval. A lower bound, since an
   * execution's interval runs from its body's start, later than the acquire its entry records. While
   * this equals `PermitsInUse` and executions are queued, they wait for the rate, not for running
   * bodies. Published only for locks with a rate.
   */
  public metricPermitsHeldForRate(lockName: string, props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.lockMetric('PermitsHeldForRate', lockName, props);
  }

  /**
   * On a lock with a rate (`rateLimit`): the waits caused by the rate when the last sweep ended. Of the
   * queued executions (`metricQueued`), one for each permit the rate holds (`metricPermitsHeldForRate`),
   * at most all of them; the others wait for permits that only running bodies or leases hold. With a
   * rate alone, or a `concurrencyLimit` above its count, a permit goes back at its interval whatever its
   * body does, so these wait for the rate alone; with a `concurrencyLimit` at or below the count, a body
   * still inside its interval holds its permit too, and these wait for the rate and those bodies
   * together. Executions that poll are in no queue, and not counted. Published only for locks with a rate.
   */
  public metricWaitingForRate(lockName: string, props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return this.lockMetric('WaitingForRate', lockName, props);
  }

  private lockMetric(metricName: string, lockName: string, props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return new cloudwatch.Metric({
      namespace: this.namespace,
      metricName,
      dimensionsMap: { TableName: this.tableName, LockName: lockName },
      statistic: 'Maximum',
      ...props,
    });
  }

  private tableMetric(metricName: string, props?: cloudwatch.MetricOptions): cloudwatch.Metric {
    return new cloudwatch.Metric({
      namespace: this.namespace,
      metricName,
      dimensionsMap: { TableName: this.tableName },
      statistic: 'Sum',
      ...props,
    });
  }
}

/**
 * An on-failure destination that grants the function `sqs:SendMessage` only (and the queue's key, if
 * any): `SqsDestination` also grants GetQueueAttributes and GetQueueUrl, which Lambda does not use.
 */
class SendOnlyQueueDestination implements lambda.IDestination {
  constructor(private readonly queue: sqs.IQueue) {}

  public bind(_scope: Construct, fn: lambda.IFunction): lambda.DestinationConfig {
    fn.addToRolePolicy(new iam.PolicyStatement({ actions: ['sqs:SendMessage'], resources: [this.queue.queueArn] }));
    this.queue.encryptionMasterKey?.grant(fn, 'kms:GenerateDataKey*', 'kms:Decrypt');
    return { destination: this.queue.queueArn };
  }
}
