// `npm run check-types`: the committed declarations in types/ are what TypeScript generates from the JSDoc
// now, and a strict TypeScript project that installs the packed package compiles against them (consumer.ts,
// with TypeScript 6 and 7, with `nodenext` and `bundler` module resolution), and so do README.md's examples
// (its `js` blocks, each type-checked as a strict JavaScript module). Exits 1 with the reason otherwise.
import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const here = fileURLToPath(new URL('.', import.meta.url));
const compilers = {
  'TypeScript 6': join(root, 'node_modules', 'typescript', 'bin', 'tsc'),
  'TypeScript 7': join(root, 'node_modules', 'typescript7', 'bin', 'tsc'),
};
const resolutions = [[], ['--module', 'esnext', '--moduleResolution', 'bundler']];

/** Run a command; on failure, print what it said and exit 1 with `why`. */
function run(why, command, args, cwd) {
  try {
    return execFileSync(command, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (error) {
    process.stderr.write(`${error.stdout ?? ''}${error.stderr ?? ''}`);
    fail(`${why}\n  (${command} ${args.join(' ')} in ${cwd})`);
  }
}

function fail(message) {
  console.error(`check-types: ${message}`);
  process.exit(1);
}

/** The first line where `actual` and `expected` differ, for the failure message. */
function firstDifference(actual, expected) {
  const [a, b] = [actual.split('\n'), expected.split('\n')];
  const line = a.findIndex((text, i) => text !== b[i]);
  const at = line === -1 ? a.length : line;
  return `line ${at + 1}: committed ${JSON.stringify(a[at] ?? '<end>')}, generated ${JSON.stringify(b[at] ?? '<end>')}`;
}

const work = mkdtempSync(join(tmpdir(), 'voxwire-client-types-'));
process.on('exit', () => rmSync(work, { recursive: true, force: true }));

// 1. The declarations are current.
const generated = join(work, 'types');
run('tsc cannot generate the declarations', process.execPath, [compilers['TypeScript 6'], '-p', 'tsconfig.json', '--outDir', generated], root);
const committedDir = join(root, 'types');
const names = (dir) => readdirSync(dir).filter((name) => name.endsWith('.d.ts')).sort();
const [committed, fresh] = [names(committedDir), names(generated)];
if (committed.join() !== fresh.join()) {
  fail(`types/ holds ${committed.join(', ') || 'nothing'}, but tsc generates ${fresh.join(', ')}: run \`npm run build-types\``);
}
for (const name of fresh) {
  const [was, now] = [readFileSync(join(committedDir, name), 'utf8'), readFileSync(join(generated, name), 'utf8')];
  if (was !== now) fail(`types/${name} is stale (${firstDifference(was, now)}): run \`npm run build-types\``);
}
console.log(`check-types: types/ is current (${fresh.length} files)`);

// 2. A strict consumer of the packed package compiles.
const packed = JSON.parse(run('npm pack failed', 'npm', ['pack', '--json', '--pack-destination', work], root));
const tarball = join(work, packed[0].filename);
const project = join(work, 'consumer');
mkdirSync(project);
writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'consumer', private: true, type: 'module' }));
run('the packed package does not install', 'npm', ['install', '--offline', '--no-audit', '--no-fund', tarball], project);
for (const name of ['consumer.ts', 'tsconfig.json', 'readme-modules.d.ts']) copyFileSync(join(here, name), join(project, name));
const examples = [...readFileSync(join(root, 'README.md'), 'utf8').matchAll(/^```js\n(.*?)^```$/gms)].map(([, code]) => code);
if (examples.length === 0) fail('README.md has no `js` example');
const exampleFiles = examples.map((code, i) => {
  writeFileSync(join(project, `readme-${i + 1}.js`), code);
  return `readme-${i + 1}.js`;
});
const readmeConfig = {
  extends: './tsconfig.json',
  compilerOptions: { allowJs: true, checkJs: true },
  files: ['readme-modules.d.ts', ...exampleFiles],
};
writeFileSync(join(project, 'tsconfig.readme.json'), JSON.stringify(readmeConfig));
for (const [compiler, tsc] of Object.entries(compilers)) {
  run(`README.md's examples do not type-check against the packed package (${compiler})`, process.execPath, [tsc, '-p', 'tsconfig.readme.json'], project);
  console.log(`check-types: README.md's ${examples.length} examples type-check (${compiler})`);
  for (const resolution of resolutions) {
    const how = `${compiler}, ${resolution.length ? 'moduleResolution bundler' : 'moduleResolution nodenext'}`;
    run(`consumer.ts does not compile against the packed package (${how})`, process.execPath, [tsc, '-p', 'tsconfig.json', ...resolution], project);
    console.log(`check-types: consumer.ts compiles against ${packed[0].filename} (${how})`);
  }
}
