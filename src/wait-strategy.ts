/**
 * How an execution that finds the lock full waits for a permit.
 */
export enum WaitStrategy {
  /**
   * Join a first-in, first-out queue of waiters and sleep in a `.waitForTaskToken` task until a
   * release hands over its permit and wakes it. Waiting costs one transition and one DynamoDB write
   * however long it lasts (one more of each per `queueCheckInterval` it outlasts), a freed permit is
   * used at once, and waiters are served in the order they arrived. The default.
   */
  QUEUE = 'QUEUE',

  /**
   * Try again every `pollInterval` (the first try after a random delay). Each try costs two state
   * transitions and one DynamoDB write, and a freed permit waits for the next try.
   */
  POLLING = 'POLLING',
}
