import * as fs from 'fs';
import * as path from 'path';

/*
 * After `tsc -p tsconfig.subpaths.json`: the declarations of cdk-sfn-semaphore/testing name the
 * constructs as the package's own (lib/, which jsii compiled), not as a second copy from src/ (a class
 * with private members is a different type in each copy), and that copy is removed.
 */
const root = path.resolve(__dirname, '..', 'types');
const index = path.join(root, 'testing', 'index.d.ts');
const text = fs.readFileSync(index, 'utf-8');
if (!text.includes("from '../src'")) {
  throw new Error(`${index} no longer imports '../src': check what this script rewrites`);
}
fs.writeFileSync(index, text.replace(/from '\.\.\/src'/g, "from '../../lib'"));
for (const file of walk(root)) {
  if (/from '\.\.\/(\.\.\/)?src[/']/.test(fs.readFileSync(file, 'utf-8'))) {
    throw new Error(`${file} refers to src/, which the package does not ship`);
  }
}
fs.rmSync(path.join(root, 'src'), { recursive: true, force: true });

function walk(dir: string): string[] {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((d) => (d.isDirectory() ? walk(path.join(dir, d.name)) : [path.join(dir, d.name)]));
}
