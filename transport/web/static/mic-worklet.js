// Captures the microphone at the AudioContext rate and posts 20 ms frames of PCM16 to the port
// it is given (the socket worker's: frames never wait on the page's main thread). It says
// "rendering" on its own port once it renders with that port in hand.
class MicProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.frame = Math.round(sampleRate / 50);
    this.buf = new Int16Array(this.frame);
    this.n = 0;
    this.out = null;
    this.announced = false;
    this.port.onmessage = (e) => { if (e.data.type === "port") this.out = e.data.port; };
  }
  process(inputs) {
    if (!this.out) return true;
    if (!this.announced) { this.port.postMessage({ type: "rendering" }); this.announced = true; }
    const ch = inputs[0] && inputs[0][0];
    if (ch) {
      for (let i = 0; i < ch.length; i++) {
        const s = Math.max(-1, Math.min(1, ch[i]));
        this.buf[this.n++] = s < 0 ? s * 32768 : s * 32767;
        if (this.n === this.frame) {
          this.out.postMessage({ type: "frame", pcm: this.buf.buffer }, [this.buf.buffer]);
          this.buf = new Int16Array(this.frame);
          this.n = 0;
        }
      }
    }
    return true;
  }
}
registerProcessor("mic", MicProcessor);
