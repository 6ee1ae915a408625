import { awscdk, Component, DependencyType, javascript } from 'projen';

// Floor for consumers: 2.211.0 (August 2025). It has `pointInTimeRecoverySpecification` (2.178, so synth
// prints no deprecation warning for the tables) and `Runtime.NODEJS_22_X`, the default of our functions. Its
// @aws-cdk/integ-tests-alpha (the dev dependency must match it exactly; the registry has no release between
// 2.95.1 and 2.211.0) deploys its assertion functions on Node.js 22, not the blocked Node.js 18.
const CDK_VERSION = '2.211.0';

const project = new awscdk.AwsCdkConstructLibrary({
  name: 'cdk-sfn-semaphore',
  description:
    'Limit how many AWS Step Functions executions run a section at once: a DynamoDB semaphore with layered cleanup.',
  author: 'cdk-sfn-semaphore contributors',
  authorAddress: 'maintainers@cdk-sfn-semaphore.dev',
  repositoryUrl: 'https://github.com/cdk-sfn-semaphore/cdk-sfn-semaphore.git',
  keywords: ['cdk', 'stepfunctions', 'semaphore', 'concurrency', 'dynamodb', 'lock'],
  defaultReleaseBranch: 'main',
  projenrcTs: true,
  packageManager: javascript.NodePackageManager.NPM,
  minNodeVersion: '20.0.0',

  cdkVersion: CDK_VERSION,
  constructsVersion: '10.0.5', // aws-cdk-lib accepts ^10.0.0; no newer constructs API is used
  jsiiVersion: '~6.0.0',

  // Declared for publishing; only the JavaScript package is built here and in CI (see `package` below).
  publishToPypi: { distName: 'cdk-sfn-semaphore', module: 'cdk_sfn_semaphore' },
  publishToMaven: {
    javaPackage: 'io.github.cdksfnsemaphore',
    mavenGroupId: 'io.github.cdk-sfn-semaphore',
    mavenArtifactId: 'cdk-sfn-semaphore',
  },
  publishToNuget: { dotNetNamespace: 'CdkSfnSemaphore', packageId: 'CdkSfnSemaphore' },
  publishToGo: { moduleName: 'github.com/cdk-sfn-semaphore/cdk-sfn-semaphore-go' },

  // Users of CDK construct libraries expect the dev tsconfig at the top level; it type-checks every
  // .ts file of the repository (tests, simulator, demo, bench, integ).
  tsconfigDevFile: 'tsconfig.dev.json',
  tsconfigDev: { include: ['.projenrc.ts'] }, // `**/*.ts` skips dotfiles

  // Lint with the dev tsconfig, which includes test/ and integ/ (projen's default, the project service,
  // looks for a tsconfig.json next to each file).
  eslintOptions: {
    dirs: ['src'],
    devdirs: ['test', 'integ', 'simulator', 'demo', 'bench', 'lambda', 'client', 'checker', 'projenrc', 'testing'],
    tsconfigPath: './tsconfig.dev.json',
    projectService: false,
  },
  experimentalIntegRunner: true,
  lambdaAutoDiscover: false, // the handlers live in lambda/, registered below
  // The constructs check JMESPath key expressions at synth time with the same library the key
  // function runs; jsii packages need their non-jsii dependencies bundled.
  // aws-local-stepfunctions is the testing kit's interpreter (see below): bundled rather than optional,
  // because its engines field asks for Node.js 22 and npm skips an optional dependency that asks more
  // than the Node.js it runs on (the simulator supplies what Node.js 20 lacks, local-sfn.ts patch 6).
  bundledDeps: ['jmespath@^0.16.0', 'aws-local-stepfunctions@3.0.0'],
  devDeps: [
    '@aws-sdk/util-dynamodb@^3', // the protocol checker marshals the document client's calls itself
    'aws-sdk-client-mock@^4',
    '@types/jmespath@^0.15.2',
    'asl-validator@^4',
    'cdk-nag@2.28.9', // the newest cdk-nag whose peer range admits our aws-cdk-lib floor (3.x needs >= 2.257)
  ],
  jestOptions: {
    // Jest 30 resolves modules through unrs-resolver (see the eslint resolver pin below); 29 does not.
    jestVersion: '^29',
    updateSnapshot: javascript.UpdateSnapshot.NEVER,
    jestConfig: {
      testTimeout: 120_000,
      // The simulator tests run on clocks scaled to real time and wait more than they compute: with two
      // workers Jest kept 0.8 of the two cores busy (581 s of CPU in 708 s), with three 1.2 (455 s) and
      // all passed; with four 1.5 (400 s), and CPU-bound files ran 17 to 37% slower, too close to the
      // timing-sensitive tests' margins.
      maxWorkers: 3,
    },
  },
  gitignore: ['.jsii.tabl.json', 'cdk.out', 'integ/**/cdk-integ.out.*', 'integ/**/*.snapshot/**/asset.*', '/bench-results/'],
});

// The integ runner adds these two at `latest`; pin them: integ-tests-alpha must match our aws-cdk-lib exactly,
// and eslint-import-resolver-typescript 3.8 is the last release without unrs-resolver, whose per-platform
// optional bindings make `npm ci` reject a lockfile written on another platform (DESIGN.md, toolchain facts).
project.deps.removeDependency('@aws-cdk/integ-tests-alpha');
project.deps.addDependency(`@aws-cdk/integ-tests-alpha@${CDK_VERSION}-alpha.0`, DependencyType.DEVENV);
project.deps.removeDependency('eslint-import-resolver-typescript');
project.deps.addDependency('eslint-import-resolver-typescript@~3.8.0', DependencyType.BUILD);

['/integ/', '/.ci/', '/simulator/', '/demo/', '/bench/', '/bench-results/', '/rosetta/', '/client/', '/checker/', '/testing/', '/tsconfig.subpaths.json'].forEach((p) =>
  project.addPackageIgnore(p),
);

// The Lambda handlers live in lambda/ (outside src/, so jsii never compiles them); esbuild bundles each,
// with the modules of src/private it imports, into assets/lambda/<name>/index.js and leaves the AWS SDK v3
// to the Lambda runtime. src/private/bundled-functions.ts builds the functions from these bundles, with the
// runtime the user chooses (projen's generated constructs fix the runtime). The target is the oldest runtime
// the constructs accept (nodejs22.x, see validation.ts).
['lambda/reconciler.lambda.ts', 'lambda/idempotency-key.lambda.ts'].forEach((entrypoint) =>
  project.bundler.addBundle(entrypoint, {
    platform: 'node',
    target: 'node22',
    externals: ['@aws-sdk/*'],
    tsconfigPath: 'tsconfig.dev.json',
  }),
);

// The CLI (`cdk-sfn-semaphore`, the package's bin) and the Node client: outside src/ (jsii exposes only
// constructs), bundled with the AWS SDK v3 and the lock schema they share with the constructs.
project.bundler.addBundle('client/cli.ts', {
  platform: 'node',
  target: 'node20',
  outfile: 'cdk-sfn-semaphore.js',
  banner: '#!/usr/bin/env node',
  externals: [],
});
project.bundler.addBundle('client/index.ts', { platform: 'node', target: 'node20', outfile: 'index.js', externals: [] });
project.addBins({ 'cdk-sfn-semaphore': 'assets/client/cli/cdk-sfn-semaphore.js' });

// cdk-sfn-semaphore/testing: the simulator, for users' tests. Bundled like the client, but its heavy
// parts stay packages: aws-cdk-lib and constructs are the user's own (a Stack must be theirs),
// aws-local-stepfunctions is patched at load time from its installed file, dynalite loads its storage
// backends itself, and the AWS SDK v3 is what the simulated Lambda runtime gives the functions' code.
// These are optional dependencies: installed by default, and outside jsii's check that every dependency
// is a jsii module (`npm install --omit=optional` leaves the kit out). aws-local-stepfunctions is pinned
// exactly (a bundled dependency, above): the load-time patches are written against its code, and fail
// loudly on any other. dynalite is pinned exactly too: the simulator serves requests through its
// internal checks and actions (simulator/dynamodb.ts), which it loads at start and fails loudly without.
// (projen renders no optionalDependencies of its own: the field is written here.)
project.package.addField('optionalDependencies', {
  'dynalite': '4.0.0',
  '@aws-sdk/client-dynamodb': '^3.600.0',
  '@aws-sdk/client-sfn': '^3.600.0',
  '@aws-sdk/lib-dynamodb': '^3.600.0',
});
project.bundler.addBundle('testing/index.ts', {
  platform: 'node',
  target: 'node20',
  outfile: 'index.js',
  externals: ['aws-cdk-lib', 'constructs', 'aws-local-stepfunctions', 'dynalite', '@aws-sdk/*'],
});
// Their type declarations (jsii documents src/ only): tsc, then the constructs named as lib/'s. Part of
// `compile`, which the test command and the packaging run (post-compile only `build` does).
project.gitignore.addPatterns('/types/');
project.compileTask.exec('tsc -p tsconfig.subpaths.json');
project.compileTask.exec('ts-node --transpile-only --project tsconfig.dev.json projenrc/subpath-types.ts');
// The subpaths, for Node (`exports`) and for TypeScript with the older module resolution (`typesVersions`).
project.package.addField('exports', {
  '.': { types: './lib/index.d.ts', default: './lib/index.js' },
  './testing': { types: './types/testing/index.d.ts', default: './assets/testing/index/index.js' },
  './client': { types: './types/client/index.d.ts', default: './assets/client/index/index.js' },
  './assets/*': './assets/*',
  './package.json': './package.json',
  './.jsii': './.jsii',
});
// The kit's code (simulator/, testing/, lambda/, client/) imports the optional dependencies.
project.tryFindObjectFile('.eslintrc.json')?.addOverride('rules.import/no-extraneous-dependencies.1.optionalDependencies', true);
project.package.addField('typesVersions', {
  '*': { testing: ['types/testing/index.d.ts'], client: ['types/client/index.d.ts'] },
});

// Integration tests live in integ/ (deployable apps, kept away from Jest); the test command verifies
// their committed snapshots without deploying, `integ:update` rewrites them.
const integTask = project.tasks.tryFind('integ');
// Each app runs transpiled only: the test command type-checks integ/ with the rest (typecheck), and
// ts-node's type-check of each app made the 4 snapshots take 75 s (now about 30).
const INTEG_APPS = '--app "node -r ts-node/register/transpile-only {filePath}" --test-regex "^integ\\.(?!.*\\.d\\.ts$).*\\.ts$"';
integTask?.reset(`integ-runner ${INTEG_APPS} --directory integ --parallel-regions us-east-1`, {
  receiveArgs: true,
});
project.tasks
  .tryFind('integ:update')
  ?.reset(`integ-runner ${INTEG_APPS} --directory integ --update-on-failed --dry-run`, {
    receiveArgs: true,
  });

// The README's and JSDoc's examples must compile (rosetta reads them from the jsii assembly). The test
// command compiles the assembly first, so that a plain `npm test` checks them too.
const rosetta = project.addTask('rosetta:extract', {
  description: 'Compile every example of the README and the JSDoc',
  exec: 'jsii-rosetta extract --compile --fail --strict .jsii',
});
project.testTask.prependSpawn(rosetta);
project.testTask.prependSpawn(project.compileTask);
project.testTask.prependSpawn(project.preCompileTask);

// ts-jest runs with isolatedModules and does not type-check: tsc does, for every .ts file of the repo.
const typecheck = project.addTask('typecheck', {
  description: 'Type-check src, tests, simulator, demo, bench and integ',
  exec: 'tsc --noEmit -p tsconfig.dev.json',
});
project.testTask.prependSpawn(typecheck);

// The simulator-backed tools (no AWS account needed).
// Both synthesize the reconciler, whose Lambda code the simulator runs from its bundle: bundle first,
// so that they work on a fresh clone.
const demo = project.addTask('demo', { description: 'Run the example app in the local simulator: 100 executions at limit 5 (see --help)' });
demo.spawn(project.tasks.tryFind('bundle')!);
demo.exec('ts-node --transpile-only --project tsconfig.dev.json demo/run.ts', { receiveArgs: true });
const bench = project.addTask('bench', { description: 'Measure our workflow beside the AWS sample in the local simulator (see --help)' });
bench.spawn(project.tasks.tryFind('bundle')!);
bench.exec('ts-node --transpile-only --project tsconfig.dev.json bench/run.ts', { receiveArgs: true });
// The protocol checker: every interleaving of bounded configurations (the test command runs them too).
const checkProtocol = project.addTask('check-protocol', {
  description: 'Search every interleaving of the lock protocol on bounded configurations (see --help)',
});
checkProtocol.spawn(project.tasks.tryFind('bundle')!);
checkProtocol.exec('ts-node --transpile-only --project tsconfig.dev.json checker/run.ts', { receiveArgs: true });
// The test command searches every configuration too, outside Jest (two processes, one per core, without
// Jest's module sandbox and coverage, which made the same searches take twice as long), each to a bound of
// 20,000 states (every interleaving of its first 11 to 36 steps, about 2 minutes alone, 4 beside Jest); CI (.ci/run) searches
// them again to 50,000 (14 to 33 steps, about 5.5 minutes). The full searches took 45 minutes of the CI's
// 90 (README, "The protocol checker"). `npm run check-protocol` runs them in full.
const quickCheck = 'ts-node --transpile-only --project tsconfig.dev.json checker/run.ts --bound 20000';
// Proof from an installed package: the README's "Test your workflow locally" example, in a fresh CDK app
// that installs the packed library (about a minute; needs the npm registry).
const testPackaged = project.addTask('test:packaged', {
  description: "Pack the library, install it into a fresh CDK app and run the README's testing-kit example there",
  exec: 'ts-node --transpile-only --project tsconfig.dev.json test/packaged/run.ts',
  receiveArgs: true,
});
project.testTask.spawn(testPackaged);

// Jest keeps about 1.2 of the two cores busy (its simulator tests wait on clocks scaled to real time): the
// checks that no clock governs (the quick protocol check, the integ snapshots, eslint) run beside it at
// the lowest CPU priority (projenrc/run-beside.ts) instead of after it, which took 3 minutes more. Every
// step that runs a simulated clock (Jest, test:packaged) keeps its normal priority.
const testSteps = () => project.testTask.steps;
const jestStep = testSteps().findIndex((s) => s.execArgs?.[0] === 'jest');
// eslint beside Jest reports and never rewrites: with `--fix` it could write a file while Jest reads it, and a
// fixable finding would pass the tests unfixed in the repository. `npx projen eslint` still fixes.
const eslintTask = project.tasks.tryFind('eslint')!;
const eslintCheck = project.addTask('eslint:check', {
  description: 'Runs eslint against the codebase and reports what `eslint --fix` would change, without changing it',
  env: eslintTask.envVars,
});
// projen adds the eslint task's last patterns (projenrc, .projenrc.ts) in its own preSynthesize: copy the step after.
new (class extends Component {
  public preSynthesize() {
    eslintCheck.reset();
    eslintCheck.execArgs(eslintTask.steps[0].execArgs!.filter((a) => a !== '--fix' && a !== '$@'), { receiveArgs: true });
  }
})(project);
const besideJest = ['npx projen eslint:check', 'npx projen integ', quickCheck];
// An argv rather than a shell line: `npm test -- -t 'two words'` reaches Jest as it was typed.
project.testTask.updateStep(jestStep, {
  execArgs: [
    ...'ts-node --transpile-only --project tsconfig.dev.json projenrc/run-beside.ts'.split(' '),
    ...besideJest.flatMap((c) => ['--beside', c]),
    '--',
    ...testSteps()[jestStep].execArgs!,
  ],
  receiveArgs: true,
});
for (const name of ['eslint', 'integ']) project.testTask.removeStep(testSteps().findIndex((s) => s.spawn === name));

// Only the JavaScript package can be built on our machines and in CI (no Python, Java, .NET or Go
// toolchains); the release workflow packages the other languages.
project.packageTask.reset();
project.packageTask.spawn(project.tasks.tryFind('package:js')!);

project.synth();
