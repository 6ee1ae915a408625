export * from './simulator';
export * from './dynamodb';
export * from './eventbridge';
export * from './random';
export * from './sfn-api';
export * from './lambda';
export * from './semaphore';
export * from './scenario';
