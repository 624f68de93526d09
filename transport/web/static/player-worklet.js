// Plays server audio from a bounded ring buffer; `clear` drops everything unplayed at once.
// Reports when each chunk starts playing and when playback drains. It is fed, and reports, on
// its own port, or on a port it is sent ({type: "port"}: the socket worker's).
class PlayerProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.cap = sampleRate * 30;           // 30 s ring: the server sends at most ~0.5 s ahead
    this.ring = new Float32Array(this.cap);
    this.read = 0; this.write = 0; this.size = 0;
    this.marks = [];                      // [absolute write position, chunk id]
    this.written = 0; this.played = 0;
    this.playing = false;
    this.out = this.port;
    const onmessage = (e) => {
      const m = e.data;
      if (m.type === "port") {
        this.out = m.port;
        this.out.onmessage = onmessage;
      } else if (m.type === "push") {
        const pcm = new Int16Array(m.pcm);
        if (this.size + pcm.length > this.cap) { this.out.postMessage({ type: "overflow" }); return; }
        this.marks.push([this.written, m.id]);
        for (let i = 0; i < pcm.length; i++) {
          this.ring[this.write] = pcm[i] / 32768;
          this.write = (this.write + 1) % this.cap;
        }
        this.size += pcm.length; this.written += pcm.length;
      } else if (m.type === "clear") {
        const dropped = this.size;
        this.read = this.write; this.size = 0; this.played = this.written; this.marks = [];
        if (this.playing) { this.playing = false; }
        this.out.postMessage({ type: "cleared", dropped });
      }
    };
    this.port.onmessage = onmessage;
  }
  process(_inputs, outputs) {
    const out = outputs[0][0];
    for (let i = 0; i < out.length; i++) {
      if (this.size > 0) {
        while (this.marks.length && this.marks[0][0] <= this.played) {
          const id = this.marks.shift()[1];
          this.out.postMessage({ type: "started", id, t: currentTime });
        }
        if (!this.playing) this.playing = true;
        out[i] = this.ring[this.read];
        this.read = (this.read + 1) % this.cap; this.size--; this.played++;
      } else {
        out[i] = 0;
        if (this.playing) { this.playing = false; this.out.postMessage({ type: "drained", t: currentTime }); }
      }
    }
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    return true;
  }
}
registerProcessor("player", PlayerProcessor);
