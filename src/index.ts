export * from './semaphore-table';
export * from './concurrency-controlled-workflow';
export * from './clean-from-incomplete';
export * from './semaphore-reconciler';
