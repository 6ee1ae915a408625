import { Duration } from 'aws-cdk-lib';
import { Budget, NO_FAULTS } from './model';
import { ConcurrencyControlledWorkflowProps, RateLimit, WaitStrategy } from '../src';

/*
 * The bounded configurations the checker searches exhaustively. Each finishes in seconds to 25
 * minutes on one core (about 100 minutes of one core in all), and together they cover every kind of
 * non-determinism the model has. The test command searches each to a bound of 20,000 states and CI
 * to 50,000 (two processes, each taking the next configuration when it is done); `npm run
 * check-protocol` runs them in full with a report, or one of them, or larger bounds.
 */

export interface CheckerConfig {
  readonly name: string;
  /** What it is for: the faults and the races it searches. */
  readonly description: string;
  readonly workflow: Partial<ConcurrencyControlledWorkflowProps>;
  readonly executions: number;
  readonly clients?: number;
  /** How many permits each client lease takes. @default 1 */
  readonly clientPermits?: number;
  /** A client refused while executions queue goes next (registers as the collector), as the CLI's waiting acquire. @default false */
  readonly clientCollects?: boolean;
  readonly budget: Budget;
  /**
   * The widest window of ticket numbers its worlds may name (see canonicalTickets in model.ts).
   * @default DEFAULT_TICKET_WINDOW (1)
   */
  readonly ticketWindow?: number;
}

const QUEUE = { waitStrategy: WaitStrategy.QUEUE, queueCheckInterval: Duration.minutes(5) };
const POLLING = { waitStrategy: WaitStrategy.POLLING };
/** A rate without a concurrency limit: 1 per 10 s, so that a second execution queues behind the first. */
const RATE_ALONE = { rateLimit: RateLimit.of(1, Duration.seconds(10)) };

export const CONFIGS: CheckerConfig[] = [
  {
    name: 'queue-stops',
    description: 'queue, limit 1: an execution stopped anywhere with its write or wake-up on the way (landing later), then redriven',
    workflow: { ...QUEUE, concurrencyLimit: 1 },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1, inFlight: 1, redrives: 1 },
    ticketWindow: 2, // the queue's own races: an orphan or a skipped ticket beside a waiting one
  },
  {
    name: 'queue-events',
    description: 'queue, limit 1: a stop and a redrive, with the status event of the stopped run delivered twice (late, after the redrive)',
    workflow: { ...QUEUE, concurrencyLimit: 1 },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1, redrives: 1, duplicateEvents: 1 },
  },
  {
    name: 'queue-timeouts',
    description: 'queue, limit 1: waits that time out, a lost wake-up, a stop',
    workflow: { ...QUEUE, concurrencyLimit: 1 },
    executions: 2,
    budget: { ...NO_FAULTS, timeouts: 2, lostWakeUps: 1, stops: 1 },
    ticketWindow: 2, // the queue's own races: an orphan or a skipped ticket beside a waiting one
  },
  {
    name: 'queue-timeouts-redrive',
    description: 'queue, limit 1: a wait that times out (a poll then finds a free permit and leaves the queue), a stop, a redrive',
    workflow: { ...QUEUE, concurrencyLimit: 1 },
    executions: 2,
    budget: { ...NO_FAULTS, timeouts: 1, stops: 1, redrives: 1 },
  },
  {
    name: 'queue-server-errors',
    description: 'queue, limit 1: writes whose response is lost (landed) or that fail before landing, a failing body, a timeout',
    workflow: { ...QUEUE, concurrencyLimit: 1 },
    executions: 2,
    budget: { ...NO_FAULTS, serverErrors: 2, bodyFailures: 1, timeouts: 1 },
    ticketWindow: 2, // the queue's own races: an orphan or a skipped ticket beside a waiting one
  },
  {
    name: 'sweep',
    // Polling: the sweep's races with holders are the same in both strategies, and with the queue's
    // ticket items beside them this search outgrows the test command (over 10 minutes and 4 GB at a
    // window of one ticket). The sweep serving the queue is searched by `clients`.
    description: 'polling, limit 1: a sweep racing a stop and a redrive (its entry read before a claim)',
    workflow: { ...POLLING, concurrencyLimit: 1 },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1, redrives: 1, sweeps: 1 },
  },
  {
    name: 'sweep-queue',
    description: 'queue, limit 1: a sweep racing a stop, with tickets to pass, serve and tidy',
    workflow: { ...QUEUE, concurrencyLimit: 1 },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1, sweeps: 1 },
  },
  {
    name: 'sweep-stale',
    // Polling, as `sweep`.
    description: 'polling, limit 1 with a lease: lost events, stale DescribeExecution, sweeps, time passing',
    workflow: { ...POLLING, concurrencyLimit: 1, leaseDuration: Duration.seconds(60) },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1, lostEvents: 1, staleReads: 1, sweeps: 1, ticks: 1 },
  },
  {
    name: 'redrive-guard',
    description: 'queue, limit 1: stopped and redriven, the guard reading stale descriptions and histories (retried by Lambda)',
    workflow: { ...QUEUE, concurrencyLimit: 1 },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1, redrives: 1, staleReads: 2 },
  },
  {
    name: 'redrive-backstop',
    description: "queue, limit 1: stopped and redriven, the guard's event lost, the sweep guarding redriven executions instead",
    workflow: { ...QUEUE, concurrencyLimit: 1 },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1, redrives: 1, lostEvents: 1, backstops: 1 },
  },
  {
    name: 'polling',
    description: 'polling, limit 1: stops with late writes, redrive, a sweep',
    workflow: { ...POLLING, concurrencyLimit: 1 },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1, inFlight: 1, redrives: 1, sweeps: 1 },
  },
  {
    name: 'polling-server-errors',
    description: 'polling, limit 1: server errors (landed or not), a stop with a late write',
    workflow: { ...POLLING, concurrencyLimit: 1 },
    executions: 2,
    budget: { ...NO_FAULTS, serverErrors: 2, stops: 1, inFlight: 1 },
  },
  {
    name: 'acquire-timeout',
    description: 'queue with an acquire timeout (a Parallel whose branch is abandoned), limit 1: stops with late writes, timeouts',
    workflow: { ...QUEUE, concurrencyLimit: 1, acquireTimeout: Duration.minutes(10) },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1, inFlight: 1, timeouts: 1 },
  },
  {
    name: 'clients',
    description: 'queue, limit 1: an execution and a client lease (the CLI), either stopped or crashing, the lease reclaimed by a sweep once expired',
    workflow: { ...QUEUE, concurrencyLimit: 1 },
    executions: 1,
    clients: 1,
    budget: { ...NO_FAULTS, stops: 1, sweeps: 1, ticks: 1 },
  },
  {
    name: 'client-collects',
    description:
      'queue, limit 1, 2 executions and a client lease that finds them queued and goes next (registers as the collector): ' +
      'the client crashing while it collects or holds, or an execution stopped (the fair run sweeps)',
    workflow: { ...QUEUE, concurrencyLimit: 1 },
    executions: 2,
    clients: 1,
    clientCollects: true,
    budget: { ...NO_FAULTS, stops: 1 },
  },
  {
    name: 'two-clients',
    description: 'limit 1: two client leases racing, one crashing while it holds, its lease reclaimed by a sweep once expired',
    workflow: { ...QUEUE, concurrencyLimit: 1 },
    executions: 0,
    clients: 2,
    budget: { ...NO_FAULTS, stops: 1, sweeps: 1, ticks: 1 },
  },
  {
    name: 'queue-failed-wake-ups',
    description: 'queue, limit 1: wake-ups that fail with Sfn.SfnException (throttled, or applied with the response lost), a stop, a timeout',
    workflow: { ...QUEUE, concurrencyLimit: 1 },
    executions: 2,
    budget: { ...NO_FAULTS, failedWakeUps: 2, stops: 1, timeouts: 1 },
  },
  {
    name: 'rate-alone',
    description: 'queue, a rate of 1 per 10 s without a concurrency limit (the permit goes back beside the body once the interval has passed): a stop anywhere',
    workflow: { ...QUEUE, ...RATE_ALONE },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1 },
  },
  {
    name: 'rate-alone-redrive',
    description: 'queue, a rate of 1 per 10 s without a concurrency limit: a stop anywhere, then a redrive, beside the cleanup and the guard; a failing body',
    workflow: { ...QUEUE, ...RATE_ALONE },
    executions: 1,
    budget: { ...NO_FAULTS, stops: 1, redrives: 1, bodyFailures: 1 },
  },
  {
    name: 'rate-alone-faults',
    description: 'queue, a rate of 1 per 10 s without a concurrency limit: a stop with a late write, a server error (landed or not)',
    workflow: { ...QUEUE, ...RATE_ALONE },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1, inFlight: 1, serverErrors: 1 },
  },
  {
    name: 'rate-alone-failures',
    description:
      'queue, a rate of 1 per 10 s without a concurrency limit: a DynamoDB call of the workflow throttled past its retries anywhere (the release beside the body among them), a failing body, a stop',
    workflow: { ...QUEUE, ...RATE_ALONE },
    executions: 2,
    budget: { ...NO_FAULTS, exhaustedRetries: 1, bodyFailures: 1, stops: 1 },
  },
  {
    name: 'rate-alone-polling',
    description: 'polling, a rate of 1 per 10 s without a concurrency limit: a stop with a late write, a failing body',
    workflow: { ...POLLING, ...RATE_ALONE },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1, inFlight: 1, bodyFailures: 1 },
  },
  {
    name: 'rate-alone-client',
    description: 'queue, a rate of 1 per 10 s without a concurrency limit: an execution and a client lease, either stopped or crashing, a sweep',
    workflow: { ...QUEUE, ...RATE_ALONE },
    executions: 1,
    clients: 1,
    budget: { ...NO_FAULTS, stops: 1, sweeps: 1, ticks: 1 },
  },
  {
    name: 'rate-alone-timeout',
    description: 'queue with an acquire timeout, a rate of 1 per 10 s without a concurrency limit: a stop with a late write, a timeout',
    workflow: { ...QUEUE, ...RATE_ALONE, acquireTimeout: Duration.minutes(10) },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1, inFlight: 1, timeouts: 1 },
  },
  {
    name: 'rate-body-slot',
    description: 'queue, a rate of 2 per 10 s beside a concurrency limit of 1 (a body slot beside each permit): a stop anywhere, then a redrive',
    workflow: { ...QUEUE, concurrencyLimit: 1, rateLimit: RateLimit.of(2, Duration.seconds(10)) },
    executions: 2,
    // With a late write and a server error too, this search passes 4 GB: they have a configuration of their own.
    budget: { ...NO_FAULTS, stops: 1, redrives: 1 },
  },
  {
    name: 'rate-body-slot-faults',
    description: 'queue, a rate of 2 per 10 s beside a concurrency limit of 1: a stop with a late write, a server error (landed or not)',
    workflow: { ...QUEUE, concurrencyLimit: 1, rateLimit: RateLimit.of(2, Duration.seconds(10)) },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1, inFlight: 1, serverErrors: 1 },
  },
  {
    name: 'rate-body-slot-client',
    description: 'queue, a rate of 2 per 10 s beside a concurrency limit of 1: an execution and a client lease sharing the body slot, a stop, a sweep',
    workflow: { ...QUEUE, concurrencyLimit: 1, rateLimit: RateLimit.of(2, Duration.seconds(10)) },
    executions: 1,
    clients: 1,
    budget: { ...NO_FAULTS, stops: 1, sweeps: 1, ticks: 1 },
  },
  {
    name: 'rate-above-limit',
    description:
      'queue, a rate of 1 per 10 s beside a concurrency limit of 2 (the permit goes back at the interval, the body keeps its slot): a stop anywhere',
    workflow: { ...QUEUE, concurrencyLimit: 2, rateLimit: RATE_ALONE.rateLimit },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1 },
  },
  {
    name: 'rate-above-limit-redrive',
    description: 'queue, a rate of 1 per 10 s beside a concurrency limit of 2, 1 execution: a stop anywhere, then a redrive, beside the cleanup and the guard; a failing body',
    workflow: { ...QUEUE, concurrencyLimit: 2, rateLimit: RATE_ALONE.rateLimit },
    executions: 1,
    budget: { ...NO_FAULTS, stops: 1, redrives: 1, bodyFailures: 1 },
  },
  {
    name: 'rate-above-limit-3',
    description: 'queue, a rate of 1 per 10 s beside a concurrency limit of 2, 3 executions (the third waits for a permit, then for a slot), no fault',
    workflow: { ...QUEUE, concurrencyLimit: 2, rateLimit: RATE_ALONE.rateLimit },
    executions: 3,
    // With a stop, 315,231 states (590 s): the stops have the configurations of two executions.
    budget: NO_FAULTS,
  },
  {
    name: 'rate-above-limit-faults',
    description: 'queue, a rate of 1 per 10 s beside a concurrency limit of 2: a stop with a late write, a server error (landed or not)',
    workflow: { ...QUEUE, concurrencyLimit: 2, rateLimit: RATE_ALONE.rateLimit },
    executions: 2,
    // With a failing body too, 893,836 states (760 s): the failing body has rate-above-limit-redrive.
    budget: { ...NO_FAULTS, stops: 1, inFlight: 1, serverErrors: 1 },
  },
  {
    name: 'weighted',
    description: 'polling, limit 3, each execution taking 2 permits: stops with late writes, redrive, a sweep',
    workflow: { ...POLLING, concurrencyLimit: 3, permits: 2 },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1, inFlight: 1, redrives: 1, sweeps: 1 },
  },
  {
    name: 'weighted-client',
    description: 'queue, limit 2: a client lease of 2 permits handing them to queued executions one at a time, a stop',
    workflow: { ...QUEUE, concurrencyLimit: 2 },
    executions: 2,
    clients: 1,
    clientPermits: 2,
    budget: { ...NO_FAULTS, stops: 1 },
  },
  {
    name: 'weighted-queue',
    description: 'queue, limit 3, each execution taking 2 permits: the second is handed one and collects the other; a stop with a late write, a redrive',
    workflow: { ...QUEUE, concurrencyLimit: 3, permits: 2 },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1, inFlight: 1, redrives: 1 },
  },
  {
    name: 'weighted-queue-3',
    description: 'queue, limit 3, three executions taking 2 permits: two handed one each at once, the second to register gives its back; a stop',
    workflow: { ...QUEUE, concurrencyLimit: 3, permits: 2 },
    executions: 3,
    budget: { ...NO_FAULTS, stops: 1 },
  },
  {
    name: 'weighted-queue-faults',
    description: 'queue, limit 3, each execution taking 2 permits: a wait that times out, a lost wake-up, a server error, a stop',
    workflow: { ...QUEUE, concurrencyLimit: 3, permits: 2 },
    executions: 2,
    budget: { ...NO_FAULTS, stops: 1, timeouts: 1, lostWakeUps: 1, serverErrors: 1 },
  },
  {
    name: 'limit-2',
    description: 'queue, limit 2, three executions: a stop, a timeout, a lost wake-up',
    workflow: { ...QUEUE, concurrencyLimit: 2 },
    executions: 3,
    budget: { ...NO_FAULTS, stops: 1, timeouts: 1, lostWakeUps: 1 },
  },
];

export function configNamed(name: string): CheckerConfig {
  const config = CONFIGS.find((c) => c.name === name);
  if (!config) throw new Error(`no checker configuration '${name}'; there are: ${CONFIGS.map((c) => c.name).join(', ')}`);
  return config;
}
