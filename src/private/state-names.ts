/**
 * Names of the states the workflow adds around the user's body. State names are part of what users
 * see (console, logs, metric filters) and what the reconciler reads from execution histories, so
 * they are defined here, once.
 */
export const STATE = {
  checkRuntimeLockName: 'Check Runtime Lock Name',
  runtimeLockNameInvalid: 'Runtime Lock Name Invalid',
  checkRuntimeLimit: 'Check Runtime Limit',
  runtimeLimitInvalid: 'Runtime Limit Invalid',
  quoteInvalidLimit: 'Quote Invalid Limit',
  formatInvalidLimitCause: 'Format Invalid Limit Cause',
  runtimeLimitMissing: 'Runtime Limit Missing',
  checkRuntimePermits: 'Check Runtime Permits',
  runtimePermitsInvalid: 'Runtime Permits Invalid',
  quoteInvalidPermits: 'Quote Invalid Permits',
  formatInvalidPermitsCause: 'Format Invalid Permits Cause',
  runtimePermitsMissing: 'Runtime Permits Missing',
  quotePermitsAboveLimit: 'Quote Permits Above Limit',
  formatPermitsAboveLimitCause: 'Format Permits Above Limit Cause',
  pickLockStripe: 'Pick Lock Stripe',
  acquire: 'Acquire Permit',
  claimOwnPermit: 'Claim Own Permit',
  waitForPermit: 'Wait For Permit',
  drawPollDelay: 'Draw Poll Delay',
  firstWait: 'Wait Before First Poll',
  poll: 'Poll For Permit',
  nextWait: 'Wait Before Next Poll',
  claimOwnPermitWhilePolling: 'Claim Own Permit While Polling',
  permitAcquired: 'Permit Acquired',
  acquireTimer: 'Wait Until Acquire Timeout',
  acquireTimedOut: 'Acquire Timed Out',
  runBody: 'Run Protected Body',
  release: 'Release Permit',
  alreadyReleased: 'Permit Already Released',
  releaseAfterFailure: 'Release Permit After Failure',
  failWithError: 'Fail With Original Error',
  prepareRelease: 'Prepare Release',
  prepareReleaseAfterFailure: 'Prepare Release After Failure',

  // The rate limit: a permit is held for at least the rate's interval after every start of the body.
  holdForRate: 'Hold Permit For Rate Interval',
  redrivenRun: 'Redriven Run?',
  holdAfterRedrive: 'Hold Permit After Redriven Body',
  holdAfterFailure: 'Hold Permit After Failure',
  // A rate alone: a failed body whose permit went back beside it fails at once.
  redrivenRunAfterFailure: 'Redriven Run After Failure?',
  checkPermitAfterFailure: 'Check Permit After Failure',
  // A rate without a concurrency limit: the permit goes back once the interval has passed, beside the body.
  prepareReleaseAtInterval: 'Prepare Release At Rate Interval',
  rateIntervalReleased: 'Permit Released At Rate Interval',
  // A concurrency limit below the rate's count: the body takes a slot beside the permit.
  takeBodySlot: 'Take Body Slot',
  waitForBodySlot: 'Wait For Body Slot',
  checkBodySlot: 'Check Body Slot',
  takeBodySlotAgain: 'Take Body Slot Again',
  bodySlotsTaken: 'Body Slots Taken',
  runBodyInSlot: 'Run Body In Slot',
  releaseBodySlot: 'Release Body Slot',
  bodySlotReleased: 'Body Slot Released',
  releaseBodySlotAfterFailure: 'Release Body Slot After Failure',
  bodySlotReleasedAfterFailure: 'Body Slot Released After Failure',
  // A concurrency limit above the rate's count: the permit goes back at the interval, the body keeps its
  // slot in an entry of no permit, which its end removes.
  releaseBodySlotAndEntry: 'Release Body Slot And Entry',
  releaseBodySlotAndEntryAfterFailure: 'Release Body Slot And Entry After Failure',
  keepBodySlot: 'Keep Body Slot',
  keepBodySlotWithoutHandOff: 'Keep Body Slot Without Hand-Off',
  handOffKeepingSlot: 'Hand Off Keeping Body Slot',
  takeBackIntoSlot: 'Take Back Into Body Slot',

  // The queue (wait strategy QUEUE).
  takeTicket: 'Take Ticket',
  pollAgain: 'Poll For Permit Again',
  leaveQueue: 'Leave Queue',
  redrivenAtLeaveQueue: 'Redriven At Leave Queue?',
  ticketLeftInQueue: 'Ticket Left In Queue',
  waitInQueue: 'Wait In Queue',
  waitInQueueAgain: 'Wait In Queue Again',
  // The queue's first wait outside a Parallel (see renderQueueWait): what follows an end other than a
  // wake-up runs in the "Wait For Permit" Parallel, which starts here and takes new tickets by these.
  resumeWait: 'Resume Wait',
  takeNewTicket: 'Take New Ticket',
  waitOnNewTicket: 'Wait In Queue On New Ticket',
  countQueueCheck: 'Count Queue Check',
  queueCheckWithinBudget: 'Queue Check Within Budget?',
  // A weighted waiter of the queue, woken with one of its permits, collects the rest.
  registerCollector: 'Register As Collector',
  completePermits: 'Complete Permits',
  confirmPermitsComplete: 'Confirm Permits Complete',
  waitToCollect: 'Wait To Collect',
  countCollectRound: 'Count Collect Round',
  collectWithinBudget: 'Collect Within Budget?',
  giveUpHandedPermit: 'Give Up Handed Permit',
  checkAllPermits: 'Check All Permits',
  checkAllPermitsAgain: 'Check All Permits Again',
  countQueueRetry: 'Count Queue Retry',
  queueRetryWithinBudget: 'Queue Retry Within Budget?',
  waitBudgetSpent: 'Wait Budget Spent',
  checkHandedOff: 'Check Handed-Off Permit',
  checkHandedOffAgain: 'Check Handed-Off Permit Again',
  readFencingToken: 'Read Fencing Token',

  // Releases that hand the permit to a waiter (also with the suffix ' After Failure').
  releaseWithoutHandOff: 'Release Permit Without Hand-Off',
  peekAtNextWaiter: 'Peek At Next Waiter',
  serveTicket: 'Serve Ticket',
  markTicket: 'Mark Ticket Served',
  readTicket: 'Read Served Ticket',
  checkTicket: 'Check Ticket',
  handOff: 'Hand Off Permit',
  wakeNextWaiter: 'Wake Next Waiter',
  isWaiterWaiting: 'Is Waiter Still Waiting',
  wakeAgain: 'Wake Next Waiter Again',
  confirmHandOff: 'Confirm Hand-Off',
  takeBackPermit: 'Take Back Permit',
  wakeUpLost: 'Wake-Up Lost',
  stillHeld: 'Is Permit Still Held',
  // A weighted holder hands its permits to waiters one at a time.
  handOffOne: 'Hand Off One Of Permits',
  confirmHandOffOne: 'Confirm Hand-Off Of One',
  wakeWaiterOfOne: 'Wake Waiter Of One',
  isWaiterOfOneWaiting: 'Is Waiter Of One Still Waiting',
  wakeWaiterOfOneAgain: 'Wake Waiter Of One Again',
  takeBackOne: 'Take Back One Permit',
  releaseWithoutHandOffAfterFailure: 'Release Permit Without Hand-Off After Failure',
  peekAtNextWaiterAfterFailure: 'Peek At Next Waiter After Failure',
  serveTicketAfterFailure: 'Serve Ticket After Failure',
  markTicketAfterFailure: 'Mark Ticket Served After Failure',
  readTicketAfterFailure: 'Read Served Ticket After Failure',
  checkTicketAfterFailure: 'Check Ticket After Failure',
  handOffAfterFailure: 'Hand Off Permit After Failure',
  wakeNextWaiterAfterFailure: 'Wake Next Waiter After Failure',
  isWaiterWaitingAfterFailure: 'Is Waiter Still Waiting After Failure',
  wakeAgainAfterFailure: 'Wake Next Waiter Again After Failure',
  confirmHandOffAfterFailure: 'Confirm Hand-Off After Failure',
  takeBackPermitAfterFailure: 'Take Back Permit After Failure',
  wakeUpLostAfterFailure: 'Wake-Up Lost After Failure',
  stillHeldAfterFailure: 'Is Permit Still Held After Failure',
  handOffOneAfterFailure: 'Hand Off One Of Permits After Failure',
  confirmHandOffOneAfterFailure: 'Confirm Hand-Off Of One After Failure',
  wakeWaiterOfOneAfterFailure: 'Wake Waiter Of One After Failure',
  isWaiterOfOneWaitingAfterFailure: 'Is Waiter Of One Still Waiting After Failure',
  wakeWaiterOfOneAgainAfterFailure: 'Wake Waiter Of One Again After Failure',
  takeBackOneAfterFailure: 'Take Back One Permit After Failure',

  // Idempotency (before the permit is taken, and after it is given back).
  computeKey: 'Compute Idempotency Key',
  claimRecord: 'Claim Idempotency Record',
  readRecord: 'Read Idempotency Record',
  checkRecord: 'Check Idempotency Record',
  validationFailed: 'Idempotency Validation Failed',
  returnStoredResult: 'Return Stored Result',
  checkOwner: 'Check Record Owner',
  isOwnerRunning: 'Is Record Owner Running',
  countWait: 'Count Duplicate Wait',
  duplicateTimedOut: 'Duplicate Wait Timed Out',
  waitForDuplicate: 'Wait For Duplicate',
  takeOverRecord: 'Take Over Idempotency Record',
  ownerMissingBefore: 'Was Record Owner Missing Before',
  noteMissingOwner: 'Note Missing Record Owner',
  waitForMissingOwner: 'Wait For Missing Record Owner',
  saveResult: 'Save Idempotent Result',
  resultNotSaved: 'Result Not Saved',
  markResultTooLarge: 'Mark Result Too Large',
  resultTooLarge: 'Result Too Large',
  markFailed: 'Mark Idempotency Record Failed',
} as const;

/**
 * Appended to the names of the release that a rate without a concurrency limit runs beside the body,
 * once the interval has passed (`Release Permit At Rate Interval`, ...). They are in no list here: to
 * the redrive guard they are inside the body, since the body may still run beside them.
 */
export const RELEASE_AT_INTERVAL_SUFFIX = ' At Rate Interval';

/**
 * Where the release beside the body ends when one of its calls failed past its retries (the release
 * after the body then gives the permit back). In no list either: the body may still run.
 */
export const RELEASE_AT_INTERVAL_FAILED = 'Release Failed At Rate Interval';

/**
 * States of a rate-limited workflow that hold the permit for the rate's interval after the body
 * started (or started again): to the redrive guard they are inside the body, since the permit must
 * stay held there.
 */
export const RATE_HOLD_STATES: string[] = [
  STATE.holdForRate,
  STATE.prepareReleaseAtInterval,
  STATE.redrivenRun,
  STATE.holdAfterRedrive,
  STATE.holdAfterFailure,
  STATE.redrivenRunAfterFailure,
  STATE.checkPermitAfterFailure,
  STATE.releaseBodySlot,
  STATE.bodySlotReleased,
  STATE.releaseBodySlotAfterFailure,
  STATE.bodySlotReleasedAfterFailure,
  STATE.releaseBodySlotAndEntry,
  STATE.releaseBodySlotAndEntryAfterFailure,
];

/**
 * States inside the body that need a body slot besides the permit (with one): the user's, the Parallels
 * around them, and the rate's Wait beside them (its branch starts with the body's, in either order in
 * the history). Not the states after the body: its slot's release, the waits after it or after a failure.
 */
export function needsBodySlot(state: string): boolean {
  return !OUTSIDE_BODY_STATES.includes(state) && (state === STATE.holdForRate || !RATE_HOLD_STATES.includes(state));
}

/**
 * States outside the protected body: an execution stopped in one of them holds no permit it needs,
 * or takes or gives back its own. Every other state of the workflow is inside the body.
 */
export const OUTSIDE_BODY_STATES: string[] = Object.values(STATE).filter(
  (name) => name !== STATE.runBody && name !== STATE.runBodyInSlot && !RATE_HOLD_STATES.includes(name),
);
