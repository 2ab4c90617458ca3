// A small hand-drawn line chart on a canvas: a rolling window of points per
// series, a y axis from 0 to a rounded maximum, three grid lines. No
// library: the console must load nothing from outside the node.

const colors = ['#2457d6', '#ef6c00', '#2e7d32', '#8e24aa']

function niceMax(v) {
  if (!(v > 0)) return 1
  const p = 10 ** Math.floor(Math.log10(v))
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p
  return 10 * p
}

export function fmt(v) {
  if (!Number.isFinite(v)) return '–'
  const a = Math.abs(v)
  if (a >= 1e9) return (v / 1e9).toFixed(1) + 'G'
  if (a >= 1e6) return (v / 1e6).toFixed(1) + 'M'
  if (a >= 1e4) return (v / 1e3).toFixed(1) + 'k'
  if (a >= 100 || Number.isInteger(v)) return String(Math.round(v))
  return v.toFixed(1)
}

export class Chart {
  constructor(canvas, { points = 120, series = 1 } = {}) {
    this.canvas = canvas
    this.points = points
    this.data = Array.from({ length: series }, () => [])
  }

  /** push appends one value per series and redraws. */
  push(...values) {
    values.forEach((v, i) => {
      const d = this.data[i]
      d.push(Number.isFinite(v) ? v : 0)
      if (d.length > this.points) d.shift()
    })
    this.draw()
  }

  draw() {
    const c = this.canvas
    const dpr = globalThis.devicePixelRatio || 1
    const w = c.clientWidth || c.width, h = c.clientHeight || c.height
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
      c.width = Math.round(w * dpr)
      c.height = Math.round(h * dpr)
    }
    const g = c.getContext('2d')
    g.setTransform(dpr, 0, 0, dpr, 0, 0)
    g.clearRect(0, 0, w, h)
    const left = 40, top = 6, right = 6, bottom = 6
    const pw = w - left - right, ph = h - top - bottom
    let max = 0
    for (const d of this.data) for (const v of d) max = Math.max(max, v)
    max = niceMax(max)
    g.font = '10px system-ui, sans-serif'
    g.fillStyle = '#5f6b7a'
    g.strokeStyle = '#e3e7ec'
    g.lineWidth = 1
    g.textAlign = 'right'
    g.textBaseline = 'middle'
    for (let i = 0; i <= 2; i++) {
      const y = top + ph - (ph * i) / 2
      g.beginPath(); g.moveTo(left, y + 0.5); g.lineTo(left + pw, y + 0.5); g.stroke()
      g.fillText(fmt((max * i) / 2), left - 4, y)
    }
    this.data.forEach((d, si) => {
      if (d.length < 2) return
      g.strokeStyle = colors[si % colors.length]
      g.lineWidth = 1.5
      g.beginPath()
      const step = pw / (this.points - 1)
      const x0 = left + pw - step * (d.length - 1)
      d.forEach((v, i) => {
        const x = x0 + i * step, y = top + ph - (ph * v) / max
        if (i === 0) g.moveTo(x, y); else g.lineTo(x, y)
      })
      g.stroke()
    })
  }
}
