// `npm run build-worklet`: writes worklet_source.js, the module that carries worklet.js's text, from which the player
// loads the AudioWorklet as a Blob URL (so an app bundled by any bundler needs no file beside its bundle).
// worklet.js stays the one source: worklet.test.js checks that the committed worklet_source.js is what this makes.
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

export const SOURCE = new URL('../worklet.js', import.meta.url);
export const TARGET = new URL('../worklet_source.js', import.meta.url);

/**
 * The module text for worklet.js's source.
 * @param {string} source worklet.js
 */
export function inlineWorklet(source) {
  return [
    '// Generated from worklet.js by `npm run build-worklet` (tools/inline-worklet.js): edit worklet.js, then run it.',
    '',
    "/** @type {string} worklet.js's source: the player loads it as a Blob URL unless given a `workletUrl`. */",
    `export const WORKLET_SOURCE = ${JSON.stringify(source)};`,
    '',
  ].join('\n');
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  writeFileSync(TARGET, inlineWorklet(readFileSync(SOURCE, 'utf8')));
}
