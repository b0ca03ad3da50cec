// AudioWorklet processors of the talk page (the AudioContext runs at 24 kHz, the protocol's rate).
//
// pcm16-capture: microphone float samples -> PCM16 little-endian chunks of 100 ms, posted to the page.
// pcm16-player:  float chunks posted by the page -> played in order as they arrive; "clear" drops what
//                is queued (barge-in, stop). Reports what it played: samples, and non-zero samples.

const CHUNK = 2400; // 100 ms at 24 kHz

class Capture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.buffer = new Int16Array(CHUNK);
    this.filled = 0;
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (channel) {
      for (let i = 0; i < channel.length; i++) {
        const s = Math.max(-1, Math.min(1, channel[i]));
        this.buffer[this.filled++] = s < 0 ? s * 32768 : s * 32767;
        if (this.filled === CHUNK) {
          this.port.postMessage(this.buffer.buffer, [this.buffer.buffer]);
          this.buffer = new Int16Array(CHUNK);
          this.filled = 0;
        }
      }
    }
    return true;
  }
}

class Player extends AudioWorkletProcessor {
  constructor() {
    super();
    this.queue = []; // Float32Arrays
    this.offset = 0; // into queue[0]
    this.played = 0;
    this.nonZero = 0;
    this.sinceReport = 0;
    this.port.onmessage = (e) => {
      if (e.data === "clear") {
        this.queue = [];
        this.offset = 0;
        this.report();
      } else {
        this.queue.push(new Float32Array(e.data));
      }
    };
  }

  report() {
    this.port.postMessage({ played: this.played, nonZero: this.nonZero, queued: this.queued() });
    this.sinceReport = 0;
  }

  queued() {
    return this.queue.reduce((n, q) => n + q.length, 0) - this.offset;
  }

  process(inputs, outputs) {
    const out = outputs[0][0];
    let i = 0;
    const wasPlaying = this.queue.length > 0;
    while (i < out.length && this.queue.length) {
      const head = this.queue[0];
      const n = Math.min(out.length - i, head.length - this.offset);
      for (let k = 0; k < n; k++) {
        const s = head[this.offset + k];
        out[i + k] = s;
        if (s !== 0) this.nonZero++;
      }
      i += n;
      this.offset += n;
      this.played += n;
      if (this.offset === head.length) {
        this.queue.shift();
        this.offset = 0;
      }
    }
    out.fill(0, i);
    this.sinceReport += out.length;
    if (this.sinceReport >= CHUNK || (wasPlaying && !this.queue.length)) this.report();
    return true;
  }
}

registerProcessor("pcm16-capture", Capture);
registerProcessor("pcm16-player", Player);
