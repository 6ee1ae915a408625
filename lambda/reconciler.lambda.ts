import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { SFNClient } from '@aws-sdk/client-sfn';
import { DynamoDBDocumentClient } from '@aws-sdk/lib-dynamodb';
import { guardRedrive, permitsHeldForRate, ReconcilerConfig, ReconcilerResult, RedriveGuardResult, StatusChangeDetail, sweep } from './reconciler-flows';
import { runFlow } from '../client/effects';
import { waitingForRate } from '../client/ticket-queue';

export type { ReconcilerResult, RedriveGuardResult, StatusChangeDetail, Reclaimed } from './reconciler-flows';

/*
 * The reconciler: the third layer of cleanup. EventBridge delivers Step Functions status-change events
 * "best effort", a cleanup can fail, and an acquire can land after its execution was stopped (after
 * the cleanup ran). Each of these leaves a permit held by nobody alive. The reconciler sweeps the lock
 * table and, for every holder:
 *
 * - an execution of a protected state machine that is not RUNNING (or does not exist) is released
 *   with the same conditional write as the cleanup;
 * - a RUNNING execution past its lease is stopped (SemaphoreLeaseExpired) and only then released, so
 *   that two holders never overlap;
 * - a holder that is not an execution (a script's lease) is released once its lease has expired,
 *   conditional on the lease not having been renewed meanwhile.
 *
 * Safe while executions acquire and release concurrently: every write is conditional on the holder
 * entry it read, and a RUNNING execution within its lease is never touched. A failure on one holder
 * is counted and the sweep goes on. The sweep stops early, and says so, when the function is about to
 * run out of time.
 *
 * The decisions live in reconciler-flows.ts, as flows the protocol checker runs too; this file reads
 * the environment, makes the calls and publishes the metrics.
 */

/**
 * What the function may be invoked with: a scheduled event, `{}` (or `{ dryRun: true }`) on demand,
 * or the status-change event of a redriven execution (the redrive guard).
 */
export interface ReconcilerEvent {
  /** Report what would be released, change nothing. */
  readonly 'dryRun'?: boolean;
  readonly 'detail-type'?: string;
  readonly 'detail'?: StatusChangeDetail;
  readonly 'time'?: string;
}

interface Context {
  getRemainingTimeInMillis(): number;
}

/** Leave this much time for the last holder and the metrics. */
const TIME_MARGIN_MS = 10_000;

const dynamodb = new DynamoDBClient({});
const clients = {
  dynamodb,
  document: DynamoDBDocumentClient.from(dynamodb),
  stepFunctions: new SFNClient({}),
  // Wake-ups get one attempt: a retried SendTaskSuccess that did wake the waiter hears TaskTimedOut and
  // would give back the permit the waiter is using. A failed one is a lost wake-up the waiter recovers.
  wakeUps: new SFNClient({ maxAttempts: 1 }),
};

export async function handler(event: ReconcilerEvent = {}, context?: Context): Promise<ReconcilerResult | RedriveGuardResult> {
  const config = configFromEnvironment();
  if (event['detail-type'] === 'Step Functions Execution Status Change' && event.detail) {
    return runFlow(guardRedrive(config, { detail: event.detail, time: event.time }), clients);
  }
  const outOfTime = () => context !== undefined && context.getRemainingTimeInMillis() < TIME_MARGIN_MS;
  const dryRun = event.dryRun === true;
  const result = await runFlow(sweep(config, dryRun, outOfTime), clients);
  emitMetrics(config.tableName, result);
  const { permitsInUse: _, holdersByLock: __, queuedByLock: ___, rateHoldsByLock: ____, ...reported } = result;
  return reported as ReconcilerResult;
}

function configFromEnvironment(): ReconcilerConfig {
  const number = (name: string) => (process.env[name] === undefined ? undefined : Number(process.env[name]));
  const stateMachineArns = (process.env.STATE_MACHINE_ARNS ?? '').split(',').filter((arn) => arn !== '');
  return {
    tableName: requiredEnv('TABLE_NAME'),
    stateMachineArns,
    clockSkewMs: Number(process.env.CLOCK_SKEW_SECONDS ?? '30') * 1000,
    lockName: process.env.LOCK_NAME,
    lockNamePath: process.env.LOCK_NAME_PATH,
    lockStripes: number('LOCK_STRIPES'),
    concurrencyLimit: number('CONCURRENCY_LIMIT'),
    concurrencyLimitPath: process.env.CONCURRENCY_LIMIT_PATH,
    permits: number('PERMITS'),
    permitsPath: process.env.PERMITS_PATH,
    leaseSeconds: number('LEASE_SECONDS'),
    holdAfterStopMs: process.env.HOLD_AFTER_STOP_SECONDS === undefined ? undefined : Number(process.env.HOLD_AFTER_STOP_SECONDS) * 1000,
  };
}

/**
 * The rate's gauges of a lock: the permits it holds, and the queued executions it keeps waiting
 * (waitingForRate: as many as those permits, at most the queue).
 */
function rateMetrics(heldForRate: number, queued: number): { PermitsHeldForRate: number; WaitingForRate: number } {
  return { PermitsHeldForRate: heldForRate, WaitingForRate: waitingForRate(queued, heldForRate) };
}

/**
 * CloudWatch metrics in the Embedded Metric Format: log lines that CloudWatch turns into metrics, so
 * the function needs no cloudwatch:PutMetricData permission.
 */
function emitMetrics(table: string, result: ReconcilerResult): void {
  const namespace = process.env.METRICS_NAMESPACE ?? 'CdkSfnSemaphore';
  const timestamp = Date.now();
  const perLock = [
    { Name: 'PermitsInUse', Unit: 'Count' },
    { Name: 'Holders', Unit: 'Count' },
    { Name: 'Queued', Unit: 'Count' },
  ];
  // Only a lock with a rate has permits the rate holds (a zero elsewhere would read as "the rate holds none").
  const withRate = [...perLock, { Name: 'PermitsHeldForRate', Unit: 'Count' }, { Name: 'WaitingForRate', Unit: 'Count' }];
  for (const [lockName, permits] of Object.entries(result.permitsInUse)) {
    const rateHolds = result.rateHoldsByLock[lockName];
    console.log(
      JSON.stringify({
        _aws: {
          Timestamp: timestamp,
          CloudWatchMetrics: [{ Namespace: namespace, Dimensions: [['TableName', 'LockName']], Metrics: rateHolds ? withRate : perLock }],
        },
        TableName: table,
        LockName: lockName,
        PermitsInUse: permits,
        Holders: result.holdersByLock[lockName] ?? 0,
        Queued: result.queuedByLock[lockName] ?? 0,
        ...(rateHolds ? rateMetrics(permitsHeldForRate(rateHolds, timestamp), result.queuedByLock[lockName] ?? 0) : {}),
      }),
    );
  }
  console.log(
    JSON.stringify({
      _aws: {
        Timestamp: timestamp,
        CloudWatchMetrics: [
          {
            Namespace: namespace,
            Dimensions: [['TableName']],
            Metrics: [
              { Name: 'PermitsReclaimed', Unit: 'Count' },
              { Name: 'LeasesExpired', Unit: 'Count' },
              { Name: 'ReconcilerErrors', Unit: 'Count' },
            ],
          },
        ],
      },
      TableName: table,
      // A waiting client's registration held nothing: its crash is no lost event.
      PermitsReclaimed: result.dryRun ? 0 : result.reclaimed.filter((r) => !r.registration).length,
      LeasesExpired: result.stopped.length,
      ReconcilerErrors: result.errors.length,
    }),
  );
  // The details on lines of their own: a large sweep must not push the metrics over the size of a log event.
  for (const reclaimed of result.reclaimed) console.log(JSON.stringify({ reclaimed, dryRun: result.dryRun }));
  for (const error of result.errors) console.log(JSON.stringify({ error }));
  if (result.truncated) console.log(JSON.stringify({ truncated: true, locks: result.locks, holders: result.holders }));
}

function requiredEnv(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`environment variable ${name} is not set`);
  return value;
}
