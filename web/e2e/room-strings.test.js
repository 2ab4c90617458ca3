// Unit tests of the room page's language rules (web/room/strings.js), in
// Node: which language a visitor sees, and how a room's strings fall back.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { en, pickLanguage, resolveStrings, format } from '../room/strings.js'

test('pickLanguage: the first browser language the room has, by tag or primary language, else the default', () => {
  const strings = { de: {}, 'pt-BR': {}, en: {} }
  for (const [browser, def, want] of [
    [['de-AT', 'en'], 'en', 'de'], // primary subtag
    [['fr', 'pt-PT'], 'en', 'pt-BR'], // same primary language, another region
    [['pt-br'], 'en', 'pt-BR'], // case-insensitive, the room's spelling
    [['fr', 'it'], 'de', 'de'], // none: the room's default
    [['fr'], undefined, 'en'], // no default: English
    [[], 'en', 'en'],
    [[undefined, '', 'DE'], 'en', 'de'],
  ]) {
    assert.equal(pickLanguage(strings, def, browser), want, `${browser} with default ${def}`)
  }
  assert.equal(pickLanguage(null, 'sv', ['de']), 'sv', 'no strings: the default language (the built-in English text)')
  assert.equal(pickLanguage(['de'], undefined, ['de']), 'en', 'strings that are not an object are ignored')
})

test('resolveStrings: the language, then the default language, then English; unknown keys and non-strings ignored', () => {
  const s = resolveStrings({
    en: { position: 'Your spot', leave: 'Quit' },
    de: { position: 'Ihr Platz', bogus: 'x', ahead: 5, waiting: 'a'.repeat(5000) },
  }, 'de', 'en')
  assert.equal(s.position, 'Ihr Platz')
  assert.equal(s.leave, 'Quit', 'from the default language')
  assert.equal(s.ahead, en.ahead, 'a number is not a string: English')
  assert.equal(s.eta, en.eta)
  assert.equal(s.bogus, undefined)
  assert.equal(s.waiting.length, 2000, 'bounded')
  assert.deepEqual(Object.keys(s).sort(), Object.keys(en).sort())
  assert.equal(resolveStrings(undefined, 'de', 'en').title, en.title)
  assert.equal(resolveStrings({ __proto__: { title: 'x' } }, 'de', 'en').title, en.title)
})

test('format replaces known placeholders only, as text', () => {
  assert.equal(format('About {h} h {m} min', { h: 1, m: 5 }), 'About 1 h 5 min')
  assert.equal(format('{position} / {nope}', { position: '<b>3</b>' }), '<b>3</b> / {nope}')
  assert.equal(format('{constructor}', {}), '{constructor}', 'no inherited properties')
})
