/*
 * The Node client of cdk-sfn-semaphore: take and give back the same permits as the workflows.
 * Bundled (AWS SDK included) to assets/client/index.js; the CLI is assets/cli/cdk-sfn-semaphore.js.
 */
export * from './semaphore-client';
