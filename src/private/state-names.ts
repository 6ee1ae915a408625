/**
 * Names of the states the workflow adds around the user's body. State names are part of what users
 * see (console, logs, metric filters) and what the reconciler reads from execution histories, so
 * they are defined here, once.
 */
export const STATE = {
  checkRuntimeLimit: 'Check Runtime Limit',
  runtimeLimitInvalid: 'Runtime Limit Invalid',
  acquire: 'Acquire Permit',
  undoAcquire: 'Undo Uncertain Acquire',
  waitForPermit: 'Wait For Permit',
  drawPollDelay: 'Draw Poll Delay',
  firstWait: 'Wait Before First Poll',
  poll: 'Poll For Permit',
  nextWait: 'Wait Before Next Poll',
  undoPoll: 'Undo Uncertain Poll',
  permitAcquired: 'Permit Acquired',
  acquireTimer: 'Wait Until Acquire Timeout',
  acquireTimedOut: 'Acquire Timed Out',
  runBody: 'Run Protected Body',
  release: 'Release Permit',
  alreadyReleased: 'Permit Already Released',
  releaseAfterFailure: 'Release Permit After Failure',
  failWithError: 'Fail With Original Error',
} as const;

/**
 * States before the protected body: an execution redriven in one of them takes its own permit, and
 * an entry it left from before the redrive (an acquire that landed after its stop) is stale.
 */
export const BEFORE_BODY_STATES: string[] = [
  STATE.checkRuntimeLimit,
  STATE.runtimeLimitInvalid,
  STATE.acquire,
  STATE.undoAcquire,
  STATE.waitForPermit,
  STATE.drawPollDelay,
  STATE.firstWait,
  STATE.poll,
  STATE.nextWait,
  STATE.undoPoll,
  STATE.permitAcquired,
  STATE.acquireTimer,
  STATE.acquireTimedOut,
];

/**
 * States outside the protected body: an execution stopped in one of them holds no permit it needs,
 * or takes or gives back its own. Every other state of the workflow is inside the body.
 */
export const OUTSIDE_BODY_STATES: string[] = Object.values(STATE).filter((name) => name !== STATE.runBody);
