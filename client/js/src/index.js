// @fanfare/client: the JavaScript SDK of fanfare (docs/protocol.md), for
// browsers and Node 20+. See README.md for the whole API.

export { connect, Client, clientDefaults } from './client.js'
export { enterRoom, Room, roomDefaults, roomUrl, roomSite } from './room.js'
export { FanfareError, ServerCodes, LocalCodes } from './errors.js'
export { Tracker, trackerDefaults } from './tracker.js'
export { backoff } from './util.js'
