export * from './semaphore-table';
export * from './concurrency-controlled-workflow';
export * from './wait-strategy';
export * from './clean-from-incomplete';
export * from './semaphore-reconciler';
export * from './idempotency-table';
export * from './idempotency-options';
export * from './idempotent-workflow';
