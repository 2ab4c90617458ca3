// The hosted waiting-room page's text: the built-in English strings, and
// how the language is picked from what the room's site object offers.
// A room's site.strings maps a language to {key: text} for any of these
// keys (docs/protocol.md §12); a key a language lacks falls back to the
// room's default language, then to English. {name} is replaced by a value.

/** en are the built-in strings, and the list of keys a room may set. */
export const en = Object.freeze({
  title: 'Waiting room',
  text: '',
  connecting: 'Finding your place in line…',
  status_waiting: "You're in line",
  status_paused: 'Paused',
  status_scheduled: 'Not open yet',
  status_granted: 'Your turn',
  status_full: 'Line full',
  status_closed: 'Closed',
  status_left: 'Not in line',
  status_loading: 'Connecting',
  status_error: 'Connection problem',
  position: 'Your place in line',
  ahead: 'Ahead of you',
  eta: 'Estimated wait',
  total: 'In line now',
  eta_soon: 'Less than a minute',
  eta_minutes: 'About {m} min',
  eta_hours: 'About {h} h {m} min',
  eta_unknown: 'Calculating…',
  next: "You're next",
  waiting: "You're in line. Keep this page open: when it's your turn, you'll move on automatically.",
  paused: 'The line is paused for a moment. You keep your place.',
  vip_ahead: 'Some priority customers were just placed ahead of you.',
  scheduled: 'The line opens soon',
  countdown: 'Opens in',
  scheduled_note: "Everyone who is here when it opens gets a random place in line, so there's no need to refresh. Keep this page open.",
  opening: 'Opening now…',
  days: 'days',
  hours: 'hours',
  minutes: 'min',
  seconds: 'sec',
  granted: "It's your turn!",
  redirecting: 'Taking you there now…',
  continue: 'Continue',
  granted_no_target: 'You have been admitted.',
  valid_until: 'Your access is valid until {time}.',
  copy_code: 'Copy access code',
  copied: 'Copied',
  rejected_full: 'The line is full right now.',
  retry_in: "We'll try again for you in {time}.",
  retrying: 'Trying again…',
  rejected_closed: 'This waiting room is closed right now.',
  ended: 'This sale has ended.',
  check_again: 'Check again',
  not_found: 'No such waiting room',
  not_found_text: 'The link you followed may be mistyped or out of date.',
  need_token: 'Please sign in first',
  need_token_text: 'This waiting room is for signed-in customers: please follow the link on the site again.',
  error: "We can't reach the waiting room. Retrying…",
  reconnecting: 'Reconnecting… you keep your place.',
  leave: 'Leave the line',
  left: 'You left the line.',
  join_again: 'Join again',
  updated: 'Updated {time}',
  live_position: 'You are number {position} in line. {ahead} ahead of you.',
  live_scheduled: 'The line opens in {time}.',
})

/** maxString bounds what a room's string may put on the page (characters). */
const maxString = 2000

/**
 * pickLanguage returns the language to show: the first of the browser's
 * languages the room has strings for (exactly, or by its primary subtag:
 * de-AT finds de), else the room's default language, else 'en'.
 */
export function pickLanguage(strings, defaultLang, browserLangs) {
  const have = new Map()
  for (const k of Object.keys(isObject(strings) ? strings : {})) have.set(k.toLowerCase(), k)
  for (const want of browserLangs ?? []) {
    if (typeof want !== 'string' || !want) continue
    const w = want.toLowerCase()
    if (have.has(w)) return have.get(w)
    const primary = w.split('-')[0]
    if (have.has(primary)) return have.get(primary)
    for (const [low, k] of have) if (low.split('-')[0] === primary) return k
  }
  if (typeof defaultLang === 'string' && have.has(defaultLang.toLowerCase())) return have.get(defaultLang.toLowerCase())
  return typeof defaultLang === 'string' && defaultLang ? defaultLang : 'en'
}

/**
 * resolveStrings returns every key of en for lang: the room's strings for
 * lang, then for its default language, then English. Non-string values and
 * unknown keys are ignored.
 */
export function resolveStrings(strings, lang, defaultLang) {
  const out = { ...en }
  const tables = isObject(strings) ? [strings[defaultLang], strings[lang]] : []
  for (const t of tables) {
    if (!isObject(t)) continue
    for (const [k, v] of Object.entries(t)) {
      if (Object.hasOwn(en, k) && typeof v === 'string') out[k] = v.slice(0, maxString)
    }
  }
  return out
}

/** format replaces {name} in template by vars[name] (as text). */
export function format(template, vars = {}) {
  return String(template).replace(/\{([a-z_]+)\}/g, (m, k) => (Object.hasOwn(vars, k) ? String(vars[k]) : m))
}

function isObject(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v)
}
