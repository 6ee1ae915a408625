/*
 * The Node client of cdk-sfn-semaphore: take and give back the same permits as the workflows.
 * Bundled (AWS SDK included) to assets/client/index/index.js; the CLI is assets/client/cli/cdk-sfn-semaphore.js
 * (see the bundles in .projenrc.ts).
 */
export * from './semaphore-client';
