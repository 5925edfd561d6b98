// What `npm publish` would ship: exactly the modules the package's entry points reach, their type declarations,
// worklet.js (for an app that loads the worklet from its own URL: `workletUrl`), package.json and README.md. No
// tests, no demo page, no screenshot, no tooling; and nothing the library needs is left out.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

const pkg = JSON.parse(readFileSync(new URL('./package.json', import.meta.url), 'utf8'));
/** Exported files that are not modules to import: the worklet, for a `workletUrl` (a bundler imports its URL). */
const FILES = ['./worklet.js', './package.json'];
const entries = Object.entries(pkg.exports).filter(([subpath]) => !FILES.includes(subpath));

/** A relative module reference in source or declarations: `from './x.js'`, `import('./x.js')`, `new URL('./x.js', ...)`. */
const RELATIVE = /['"]\.\/([\w.-]+\.js)['"]/g;

/**
 * The files `start` reaches by relative references, `start` included; in declarations, `./x.js` means `./x.d.ts`.
 * @param {string[]} start paths relative to the package root
 */
function reachable(start) {
  const found = new Set();
  const pending = start.map((path) => path.replace(/^\.\//, ''));
  while (pending.length > 0) {
    const path = pending.pop();
    if (found.has(path)) continue;
    found.add(path);
    const folder = path.slice(0, path.lastIndexOf('/') + 1);
    const declarations = path.endsWith('.d.ts');
    for (const [, name] of readFileSync(new URL(path, import.meta.url), 'utf8').matchAll(RELATIVE)) {
      pending.push(folder + (declarations ? name.replace(/\.js$/, '.d.ts') : name));
    }
  }
  return found;
}

function packed() {
  const out = execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], {
    cwd: new URL('.', import.meta.url),
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  return JSON.parse(out)[0].files.map((file) => file.path).sort();
}

test('each entry point has its module and its declarations', () => {
  assert.deepEqual(entries.map(([subpath]) => subpath), ['.', './protocol']);
  for (const [, target] of entries) {
    assert.match(target.default, /^\.\/[\w-]+\.js$/);
    assert.equal(target.types, target.default.replace(/^\.\/(.*)\.js$/, './types/$1.d.ts'));
  }
  assert.equal(pkg.main, pkg.exports['.'].default);
  assert.equal(pkg.types, pkg.exports['.'].types);
});

test('npm pack ships the library, its declarations, worklet.js, package.json, README.md and LICENSE, and nothing else', () => {
  const modules = reachable(entries.map(([, target]) => target.default));
  const declarations = [...modules].map((path) => `types/${path.replace(/\.js$/, '.d.ts')}`);
  for (const path of reachable(entries.map(([, target]) => target.types))) assert.ok(declarations.includes(path), path);
  assert.ok(modules.has('worklet_source.js'), 'the player loads the worklet from its source, built in');
  assert.equal(pkg.exports['./worklet.js'], './worklet.js');
  const expected = [...modules, ...declarations, 'worklet.js', 'package.json', 'README.md', 'LICENSE'].sort();
  assert.deepEqual(packed(), expected);
});
