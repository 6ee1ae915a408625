/*
 * An execution's history budget. A Standard execution fails once its history reaches 25,000 events
 * ("If the event number 25,000 isn't ExecutionSucceeded, ... the state machine execution fails because
 * of reaching the history limit", https://docs.aws.amazon.com/step-functions/latest/dg/bp-history-limit.html),
 * with `States.Runtime`, and such an execution cannot be redriven. Every loop of the workflow therefore
 * counts what it spends and gives up, with the acquire-timeout error and the release path, well before.
 *
 * Events are counted as Step Functions logs them (the simulator counts them the same way): a Pass,
 * Choice or Wait state is entered and exited (2); a Task is entered, scheduled, started, ends and is
 * exited (5), with a callback also submitted (6); each retry adds 3. The counts below are for rounds
 * without retries: a round that retries spends 3 more events per retry out of the reserve (7,000
 * events: about two retries in every round of a wait that lasts its longest; a wait that retries more
 * than that under sustained throttling can still reach the limit).
 */

/** Step Functions' quota of history events per execution. */
export const HISTORY_EVENT_LIMIT = 25_000;

/**
 * The events an execution's waits may spend together: the semaphore's wait, and the wait for a
 * duplicate of an idempotent execution (at most half of it in a ConcurrencyControlledWorkflow). The
 * other 7,000 are the reserve: the start, the acquire, the body, the release and its hand-off, and
 * retries.
 */
export const WAIT_HISTORY_EVENTS = 18_000;

/**
 * What a wait spends before its first round: the "Wait For Permit" Parallel (entered, started, ended,
 * exited), its first Take Ticket and Wait In Queue (or Draw Poll Delay and Wait Before First Poll),
 * and the acquire timer's Wait. (Where the first wait runs outside the Parallel: Take Ticket (5), Wait
 * In Queue (6), the Parallel (4) and Resume Wait (2): 17.)
 */
export const WAIT_ENTRY_EVENTS = 20;

/** A queue round after a wait timed out: Poll For Permit Again (5), the count and its check (4), Wait In Queue Again (6). */
export const QUEUE_CHECK_ROUND_EVENTS = 15;

/**
 * A queue round after a refusal, back to Take Ticket and its wait: at most a refused wait (6), a check
 * (5), a poll (5), a second check (5) and Wait Before Next Poll (2), the count and its check (4), and
 * Take Ticket (5).
 */
export const QUEUE_RETRY_ROUND_EVENTS = 32;

/**
 * A round of a weighted waiter of the queue collecting its permits: Wait To Collect (2), the count and
 * its check (4), Complete Permits (5), and after a server error Confirm Permits Complete (5).
 */
export const COLLECT_ROUND_EVENTS = 16;

/** A polling round: Wait Before Next Poll (2) and Poll For Permit (5). */
export const POLL_ROUND_EVENTS = 7;

/** The events each check of a waiting duplicate spends (idempotency: seven states). */
export const DUPLICATE_CHECK_EVENTS = 23;

/** How many rounds of `eventsPerRound` fit in a wait of `waitEvents` events. */
export function roundsWithin(waitEvents: number, eventsPerRound: number): number {
  return Math.floor((waitEvents - WAIT_ENTRY_EVENTS) / eventsPerRound);
}

/**
 * The share of WAIT_HISTORY_EVENTS that a workflow with a body slot (a concurrency limit other than its
 * rate's count) keeps for the wait for a slot, after the wait for the permit: about 220 rounds.
 */
export const BODY_SLOT_WAIT_EVENTS = 4_000;

/**
 * A round of the wait for a body slot: the Parallel "Wait For Body Slot" entered, started, failed and
 * retried (4), Check Body Slot (5), Take Body Slot Again (5), and Body Slots Taken (2), with a margin (2).
 */
export const BODY_SLOT_ROUND_EVENTS = 18;

/**
 * A slot is held for its whole body, so a wait for one can last as long as a body: its tries back off
 * from `pollInterval` by this factor each, up to BODY_SLOT_MAX_DELAY_SECONDS apart, which stretches the
 * same history budget from minutes to hours (a `pollInterval` of a minute or more stays fixed).
 */
export const BODY_SLOT_BACKOFF_RATE = 1.2;
/** The longest pause between two tries of a wait for a body slot, seconds (see BODY_SLOT_BACKOFF_RATE). */
export const BODY_SLOT_MAX_DELAY_SECONDS = 60;

/** How the tries of a wait for a body slot are spaced: the first pause, the factor, the longest pause (seconds). */
export interface SlotWaitPacing {
  readonly intervalSeconds: number;
  readonly backoffRate: number;
  readonly maxDelaySeconds: number;
}

/** The pacing of a wait for a body slot: from `pollInterval`, backing off to a minute apart; a `pollInterval` of a minute or more stays fixed. */
export function slotWaitPacing(pollSeconds: number): SlotWaitPacing {
  return pollSeconds < BODY_SLOT_MAX_DELAY_SECONDS
    ? { intervalSeconds: pollSeconds, backoffRate: BODY_SLOT_BACKOFF_RATE, maxDelaySeconds: BODY_SLOT_MAX_DELAY_SECONDS }
    : { intervalSeconds: pollSeconds, backoffRate: 1, maxDelaySeconds: pollSeconds };
}

/**
 * How long `rounds` tries of a wait for a body slot pause in all, seconds, as Step Functions spaces a
 * Retry's attempts: the interval times the backoff rate to the attempt's power, each capped at the
 * longest pause (MaxDelaySeconds), without jitter.
 */
export function slotWaitSeconds(pacing: SlotWaitPacing, rounds: number): number {
  let total = 0;
  for (let attempt = 0; attempt < rounds; attempt++) {
    total += Math.min(pacing.intervalSeconds * Math.pow(pacing.backoffRate, attempt), pacing.maxDelaySeconds);
  }
  return total;
}
