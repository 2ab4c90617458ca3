// index.d.ts is written by hand: this keeps it in step with the modules.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { readFile } from 'node:fs/promises'
import * as sdk from '../src/index.js'

const dts = await readFile(new URL('../index.d.ts', import.meta.url), 'utf8')
const pkg = JSON.parse(await readFile(new URL('../package.json', import.meta.url), 'utf8'))

test('every export of src/index.js is declared in index.d.ts', () => {
  for (const name of Object.keys(sdk)) {
    assert.match(dts, new RegExp(`export declare (?:function|class|const) ${name}\\b`), `index.d.ts does not declare ${name}`)
  }
})

test('every public method of Client, Room and Tracker is declared', () => {
  for (const cls of ['Client', 'Room', 'Tracker']) {
    const body = dts.slice(dts.indexOf(`export declare class ${cls}`))
    const decl = body.slice(0, body.indexOf('\n}\n'))
    const proto = sdk[cls].prototype
    for (const name of Object.getOwnPropertyNames(proto)) {
      if (name === 'constructor' || name.startsWith('_')) continue
      assert.match(decl, new RegExp(`\\b${name}\\b`), `${cls}.${name} is not declared in index.d.ts`)
    }
  }
})

test('every option with a default is declared, and the package points at the sources', () => {
  for (const name of [...Object.keys(sdk.clientDefaults), ...Object.keys(sdk.roomDefaults)]) {
    assert.match(dts, new RegExp(`\\b${name}\\?:`), `option ${name} is not declared`)
  }
  assert.equal(pkg.name, '@fanfare/client')
  assert.equal(pkg.type, 'module')
  assert.equal(pkg.exports['.'].import, './src/index.js')
  assert.equal(pkg.types, './index.d.ts')
  assert.equal(pkg.dependencies, undefined, 'no runtime dependencies')
})
