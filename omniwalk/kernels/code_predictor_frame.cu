// The code predictor's frame in one launch, CUDA (``kernels/cuda_frame.py`` builds it at first use with NVRTC
// through torch.cuda and #defines its shape in front: BATCH, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE,
// VOCAB, BLOCK_V, GROUPS, LAYERS, CAPACITY, CANDIDATES, THREADS, CHUNK, RING_CHUNKS, RES_COLS, SCRATCH, EPS,
// SCALE, TRACE, and the outputs' layout below).
//
// One block per SM, all resident at once: THREADS that compute and one copy warp. Each block owns fixed rows
// of every projection of the frame (the same share of each step's output columns in every pass); the copy
// warp streams those rows' weights into a ring of shared memory with bulk copies, a slot as soon as the steps
// release it (a pair of barriers a slot: landed, released), so the stream runs ahead of the dependency chain as
// far as the ring lets it (the weights depend on nothing the kernel writes) and the threads that compute never
// wait to issue a copy. A step's outputs are written with the launch's epoch beside each value (one 32-bit word:
// bf16 bits, epoch << 16); reading a step's input spins until every word carries the epoch, so that read is the
// step's wait: no counter, no fence. Every output of every pass has its own words (written once a launch). The
// steps of a pass, per layer:
//
//     QKV      the input-normed residual rows times the block's q/k/v projection rows
//     ATTN     (request, kv head) on one block each: q/k norm and rope, K/V kept in the block's own cache
//              (global memory no other block reads), its q heads' attention over positions 0..the token's
//     OUT      the attention rows times the block's output-projection rows, plus the residual: the residual
//     GATE_UP  the post-normed residual times the block's gate and up rows: silu(gate) * up
//     DOWN     that times the block's down rows, plus the residual: the residual
//
// then HEAD (the final-normed last token row of each request times the block's rows of the pass's head: the
// logits). Then the pass's codes are drawn from the whole logits rows and their embeddings are the next pass's
// input: for one request every block draws it itself (the same arithmetic in every block: the same code, no
// wait); for more, block b draws request b's and gives it to the others in a flagged word (a draw takes longer
// than a step, and B of them one after another in every block would take B times that), and writes it and
// its request's running sum. A pass has 21 waits (4 a layer and the head's), the ATTN step one more a layer,
// and for more than one request the codes' (the next pass's first step).
//
// Rounding follows the PyTorch reference (``networks/talker.CodePredictor``): every value the reference holds
// in bf16 is rounded to bf16 at the same step; sums inside a step are fp32.

#define QKV_W ((HEADS + 2 * KV_HEADS) * HEAD_DIM)
#define ATTN_W (HEADS * HEAD_DIM)
#define GQ (HEADS / KV_HEADS)
#define PASSES (GROUPS - 1)
#define ROWS0 (2 * BATCH)  // token rows of the first pass (two a request)
#define WARPS (THREADS / 32)
#define PARTS ((GQ + 2) * HEAD_DIM / 32 + GQ + 1)
#define KV_AT (((GQ + 2) * HEAD_DIM + PARTS + GQ * CAPACITY + 3) / 4 * 4)  // (floats: 16-byte aligned)
#define RING (CHUNK * RING_CHUNKS)
// the outputs' words (``FramePlan.layout``, #defined in front): per pass and layer, each output's ROWS0 rows
// from AT_QKV, AT_ATTN, AT_RES_A (the residual after attention), AT_ACT, AT_RES_M (after the MLP) of the
// layer's LAYER_WORDS; the pass's logits after its layers; PASS_WORDS a pass
#define STEPS (PASSES * (5 * LAYERS + 1))  // a frame's steps: per layer QKV, ATTN, OUT, GATE_UP, DOWN; the head
#define FLAG_PENALTY 1
#define FLAG_BANNED 2
#define FLAG_TOP 4
#define FLAG_SAMPLED 8
#define FLAG_ALLOWED 16

#define KEY_MIN (-9223372036854775807ll - 1)
#define POS_INF __int_as_float(0x7f800000)
#define NEG_INF __int_as_float(0xff800000)
#define SPINS (1 << 20)  // loads of a word not yet written before its wait gives up (sync[2] says so)

typedef unsigned short bf16;
typedef unsigned int word;

// the consumers' barrier (named barrier 1 over the THREADS that compute; the copy warp never joins it)
__device__ __forceinline__ void sync_consumers() { asm volatile("bar.sync 1, %0;" :: "n"(THREADS) : "memory"); }

__device__ unsigned int* give_up;  // (set once a launch: where a wait that gives up says so)

__device__ __forceinline__ float bf(bf16 h) { return __uint_as_float((unsigned int)h << 16); }

__device__ __forceinline__ bf16 to_bf(float f) {  // round to nearest even, as torch
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

__device__ __forceinline__ float round_bf(float f) { return bf(to_bf(f)); }

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ long long max64(long long a, long long b) { return a > b ? a : b; }

__device__ __forceinline__ long long warp_max64(long long x) {
    for (int o = 16; o > 0; o >>= 1) x = max64(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ unsigned int shared_address(const void* p) {
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (unsigned int)a;
}

// ---- flagged words: a value and the epoch of the launch that wrote it ----

__device__ __forceinline__ void put(word* p, float value, unsigned int epoch) {
    const word w = (word)to_bf(value) | (epoch << 16);
    asm volatile("st.volatile.global.u32 [%0], %1;" :: "l"(p), "r"(w) : "memory");
}

__device__ __forceinline__ void put_code(word* p, int code, unsigned int epoch) {  // (a code: 16 bits as they are)
    const word w = (word)code | (epoch << 16);
    asm volatile("st.volatile.global.u32 [%0], %1;" :: "l"(p), "r"(w) : "memory");
}

__device__ __forceinline__ word load_word(const word* p) {
    word w;
    asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(w) : "l"(p) : "memory");
    return w;
}

__device__ __forceinline__ uint4 load_words4(const word* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ bool fresh4(uint4 v, unsigned int epoch) {
    return (v.x >> 16) == epoch && (v.y >> 16) == epoch && (v.z >> 16) == epoch && (v.w >> 16) == epoch;
}

// whether a wait that has loaded ``n`` times gives up: past SPINS loads (a block not resident, a bug), or once
// another wait of the launch gave up; the launch's outputs are then wrong, and the host raises on sync[2]
__device__ __forceinline__ bool gives_up(int n) {
    if ((n & 4095) != 4095) return false;
    if (n >= SPINS) {
        atomicExch(give_up, 1u);
        return true;
    }
    return *(volatile unsigned int*)give_up != 0u;
}

// the 16 bits at ``p`` once this launch wrote them
__device__ __forceinline__ unsigned int take_bits(const word* p, unsigned int epoch) {
    word w = load_word(p);
    for (int n = 0; (w >> 16) != epoch && !gives_up(n); n++) w = load_word(p);
    return w & 0xffffu;
}

// the value at ``p`` once this launch wrote it
__device__ __forceinline__ float take(const word* p, unsigned int epoch) { return bf((bf16)take_bits(p, epoch)); }

// ---- the weight stream: the block's rows of each projection, in the order the steps use them ----

// segment ``seg`` of the block's stream (per pass and layer: q/k/v, output, gate, up, down rows; per pass
// then the head's rows): its first byte and its length
struct Segment {
    const unsigned char* src;
    int bytes;
};

__device__ __forceinline__ int share_start(int n, int block) { return n * block / gridDim.x; }

struct Weights {
    const bf16* qkv;      // [LAYERS, QKV_W, HIDDEN]
    const bf16* o;        // [LAYERS, HIDDEN, ATTN_W]
    const bf16* gate_up;  // [LAYERS, 2 * INTERMEDIATE, HIDDEN]: gate rows, then up rows
    const bf16* down;     // [LAYERS, HIDDEN, INTERMEDIATE]
    const bf16* heads;    // [PASSES, VOCAB, HIDDEN]
};

__device__ Segment segment(const Weights& w, int seg) {
    const int pass = seg / (5 * LAYERS + 1), i = seg % (5 * LAYERS + 1), b = blockIdx.x;
    const bf16* base;
    int n, k;
    if (i == 5 * LAYERS) {
        base = w.heads + (long long)pass * VOCAB * HIDDEN, n = VOCAB, k = HIDDEN;
    } else {
        const int layer = i / 5, kind = i % 5;
        if (kind == 0) base = w.qkv + (long long)layer * QKV_W * HIDDEN, n = QKV_W, k = HIDDEN;
        else if (kind == 1) base = w.o + (long long)layer * HIDDEN * ATTN_W, n = HIDDEN, k = ATTN_W;
        else if (kind < 4) {  // (gate rows, then up rows)
            base = w.gate_up + ((long long)layer * 2 + kind - 2) * INTERMEDIATE * HIDDEN, n = INTERMEDIATE, k = HIDDEN;
        }
        else base = w.down + (long long)layer * HIDDEN * INTERMEDIATE, n = HIDDEN, k = INTERMEDIATE;
    }
    const int r0 = share_start(n, b), r1 = share_start(n, b + 1);
    Segment s;
    s.src = (const unsigned char*)(base + (long long)r0 * k);
    s.bytes = (r1 - r0) * k * 2;
    return s;
}

#define SEGMENTS (PASSES * (5 * LAYERS + 1))

struct Stream {
    int seg;     // the segment the next chunk comes from
    int offset;  // its byte offset there
};

// the wait for a barrier's phase of parity ``parity`` to complete (giving up as the words' waits do)
__device__ __forceinline__ void wait_phase(const unsigned long long* bar, unsigned int parity) {
    const unsigned int at = shared_address(bar);
    unsigned int done = 0;
    for (int n = 0; !gives_up(n); n++) {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(done) : "r"(at), "r"(parity) : "memory");
        if (done) return;
    }
}

// the copy warp's one thread: every chunk of the block's stream, in order, into ring slot chunk % RING_CHUNKS
// with one bulk copy (the slot's ``full`` barrier expects its bytes), once the steps released the slot's
// previous chunk (its ``empty`` barrier). Segments without rows take no chunk. Its waits for the copy engine
// and for free slots hold no thread that computes.
__device__ void produce(const Weights& w, unsigned char* slots, unsigned long long* full, unsigned long long* empty) {
    Stream st = {0, 0};
    for (long long c = 0;; c++) {
        while (st.seg < SEGMENTS && segment(w, st.seg).bytes == 0) st.seg++;
        if (st.seg >= SEGMENTS) return;
        const Segment s = segment(w, st.seg);
        const int slot = (int)(c % RING_CHUNKS), bytes = min(s.bytes - st.offset, CHUNK);
        if (c >= RING_CHUNKS) wait_phase(empty + slot, (unsigned int)(c / RING_CHUNKS - 1) & 1u);
        const unsigned int bar = shared_address(full + slot);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     :: "r"(shared_address(slots + slot * CHUNK)), "l"(s.src + st.offset), "r"(bytes), "r"(bar)
                     : "memory");
        st.offset += CHUNK;
        if (st.offset >= s.bytes) { st.seg += 1; st.offset = 0; }
    }
}

// the computing threads' side of the ring: the current step's first chunk
struct Ring {
    unsigned char* slots;
    unsigned long long* full;   // [RING_CHUNKS] a slot's chunk has landed
    unsigned long long* empty;  // [RING_CHUNKS] the steps are done with a slot's chunk
    long long begin;
};

// until chunks begin .. begin + chunks - 1 are in the ring (a step's chunks fit it: FramePlan.check)
__device__ __forceinline__ void arrive(const Ring* r, int chunks) {
    for (long long c = r->begin; c < r->begin + chunks; c++) {
        wait_phase(r->full + c % RING_CHUNKS, (unsigned int)(c / RING_CHUNKS) & 1u);
    }
}

// after the consumers' barrier that follows a step's last reads of its chunks: their slots back to the copy warp
__device__ __forceinline__ void release(Ring* r, int chunks) {
    if (threadIdx.x == 0) {
        for (long long c = r->begin; c < r->begin + chunks; c++) {
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(shared_address(r->empty + c % RING_CHUNKS))
                         : "memory");
        }
    }
    r->begin += chunks;
}

__device__ __forceinline__ int chunks_of(int bytes) { return (bytes + CHUNK - 1) / CHUNK; }

// ---- a step's input rows into shared memory (bf16), normed where a norm weight is given ----

struct Scratch {
    bf16* xs;      // [ROWS0, XMAX] the step's input rows (bf16); also the draw's and attention's room
    float* red;    // [WARPS * ROWS0]
    float* rstd;   // [ROWS0]
    int* codes;    // [BATCH] the codes the block drew last
    float* res;    // [ROWS0, RES_COLS] the residual at the block's hidden columns (OUT's and DOWN's epilogue)
};

// the residual rows a pass starts from: row r's value at column c (the first pass: each request's talker
// hidden state, then its code 0 embedding; later passes: the embedding of the code drawn the pass before)
__device__ __forceinline__ float pass_input(const bf16* x0, const bf16* embeds, const int* codes, int pass, int r,
                                            int c) {
    if (pass == 0) return bf(x0[r * HIDDEN + c]);
    return bf(embeds[((long long)(pass - 1) * VOCAB + codes[r]) * HIDDEN + c]);
}

// rows ``rows`` of the input into xs[r * K ..]: from flagged words ``src`` (row stride ``stride``, row r taken
// from row ``first + r * step``) or, where src is null, the pass's input; then RMS-normed with ``norm``
// (fp32 statistics, rounded as RMSNorm rounds) where it is not null
__device__ void read_rows(const word* src, int stride, int first, int step, int rows, int K, const bf16* norm,
                          const bf16* x0, const bf16* embeds, int pass, Scratch& sc, unsigned int epoch) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int r = 0; r < rows; r++) {
        float ss = 0.f;
        for (int v = tid; v < K / 4; v += THREADS) {
            float a[4];
            if (src) {
                const word* p = src + (long long)(first + r * step) * stride + 4 * v;
                uint4 q = load_words4(p);
                for (int n = 0; !fresh4(q, epoch) && !gives_up(n); n++) q = load_words4(p);
                a[0] = bf(q.x & 0xffffu), a[1] = bf(q.y & 0xffffu), a[2] = bf(q.z & 0xffffu), a[3] = bf(q.w & 0xffffu);
            } else {
                for (int j = 0; j < 4; j++) a[j] = pass_input(x0, embeds, sc.codes, pass, first + r * step, 4 * v + j);
            }
            for (int j = 0; j < 4; j++) {
                sc.xs[r * K + 4 * v + j] = to_bf(a[j]);
                ss += a[j] * a[j];
            }
        }
        if (norm) {
            ss = warp_sum(ss);
            if (lane == 0) sc.red[warp * ROWS0 + r] = ss;
        }
    }
    sync_consumers();
    if (!norm) return;
    if (tid < rows) {
        float total = 0.f;
        for (int w = 0; w < WARPS; w++) total += sc.red[w * ROWS0 + tid];
        sc.rstd[tid] = rsqrtf(total / K + EPS);
    }
    sync_consumers();
    for (int i = tid; i < rows * K; i += THREADS) {
        const int r = i / K, k = i % K;
        const float normed = round_bf(bf(sc.xs[i]) * sc.rstd[r]);
        sc.xs[i] = to_bf(bf(norm[k]) * normed);
    }
    sync_consumers();
}

// the residual's rows at the block's hidden columns h0..h1-1 into sc.res (read_rows' barrier then shows them),
// from flagged words ``src`` or, where src is null, the pass's input. Asked before the step's input: the block
// already waited for every word of it (its QKV or GATE_UP step read the whole rows), so the loads do not wait
// and their latency leaves the step's end.
__device__ __forceinline__ void residual_at(const word* src, int h0, int h1, int rows, const bf16* x0,
                                            const bf16* embeds, int pass, Scratch& sc, unsigned int epoch) {
    for (int t = threadIdx.x; t < rows * (h1 - h0); t += THREADS) {
        const int r = t / (h1 - h0), i = t % (h1 - h0);
        sc.res[r * RES_COLS + i] = src ? take(src + r * HIDDEN + h0 + i, epoch)
                                       : pass_input(x0, embeds, sc.codes, pass, r, h0 + i);
    }
}

// a row of weights in the ring (from byte ``at``, K entries) times the step's input rows: this lane's
// partial sums (the caller sums the warp). K is the step's constant, so the loop unrolls (its passes in pairs,
// as many as the registers let go out together: fewer at more rows, which give their own chains), and each
// row's sum is two independent chains (a pair's first pass, its second).
constexpr int K_PAIRS = 1;  // (unrolled together; a pragma takes a constant, not a macro)
template <int K>
__device__ __forceinline__ void row_times_inputs(const unsigned char* ring, int at, int rows, const bf16* xs,
                                                 float* acc) {
    const int lane = threadIdx.x & 31;
    constexpr int PASSES_K = (K + 255) / 256;  // (256 entries a pass: 8 a lane)
    float part[ROWS0][2];
#pragma unroll
    for (int r = 0; r < ROWS0; r++) part[r][0] = part[r][1] = 0.f;
    auto pass_k = [&](int j, int chain) {
        const int k = lane * 8 + j * 256;
        if (j == PASSES_K - 1 && k >= K) return;  // (only the last pass's lanes past K)
        int p = at + 2 * k;
        if (p >= RING) p -= RING;
        const uint4 w = *(const uint4*)(ring + p);
        const float w0 = __uint_as_float(w.x << 16), w1 = __uint_as_float(w.x & 0xffff0000u);
        const float w2 = __uint_as_float(w.y << 16), w3 = __uint_as_float(w.y & 0xffff0000u);
        const float w4 = __uint_as_float(w.z << 16), w5 = __uint_as_float(w.z & 0xffff0000u);
        const float w6 = __uint_as_float(w.w << 16), w7 = __uint_as_float(w.w & 0xffff0000u);
#pragma unroll
        for (int r = 0; r < ROWS0; r++) {
            if (r < rows) {
                const uint4 x = *(const uint4*)(xs + r * K + k);
                part[r][chain] += w0 * __uint_as_float(x.x << 16) + w1 * __uint_as_float(x.x & 0xffff0000u)
                                + w2 * __uint_as_float(x.y << 16) + w3 * __uint_as_float(x.y & 0xffff0000u)
                                + w4 * __uint_as_float(x.z << 16) + w5 * __uint_as_float(x.z & 0xffff0000u)
                                + w6 * __uint_as_float(x.w << 16) + w7 * __uint_as_float(x.w & 0xffff0000u);
            }
        }
    };
#pragma unroll K_PAIRS
    for (int j = 0; j < PASSES_K; j += 2) {
        pass_k(j, 0);
        if (j + 1 < PASSES_K) pass_k(j + 1, 1);
    }
#pragma unroll
    for (int r = 0; r < ROWS0; r++) {
        if (r < rows) acc[r] = warp_sum(part[r][0] + part[r][1]);
    }
}

// lane r's row of a warp's sums (lanes past the rows: row 0's)
__device__ __forceinline__ float lane_row(const float* acc) {
    const int lane = threadIdx.x & 31;
    float mine = acc[0];
#pragma unroll
    for (int r = 1; r < ROWS0; r++) mine = lane == r ? acc[r] : mine;
    return mine;
}

// ---- attention: one (request, kv head) of a layer, on the block that always takes it ----

__device__ void attend(word* pass_words, int layer, int tile, int pass, const bf16* q_norm, const bf16* k_norm,
                       const bf16* cos_t, const bf16* sin_t, bf16* keys, bf16* values, Scratch& sc,
                       unsigned int epoch) {
    const int tid = threadIdx.x, b = tile / KV_HEADS, j = tile % KV_HEADS;
    const int tokens = pass == 0 ? 2 : 1, pos0 = pass == 0 ? 0 : pass + 1;
    word* qkv = pass_words + layer * LAYER_WORDS + AT_QKV;
    word* out = pass_words + layer * LAYER_WORDS + AT_ATTN;
    float* vec = (float*)sc.xs;                       // [(GQ + 2) * HEAD_DIM]: q heads, k (normed, roped)
    float* part = vec + (GQ + 2) * HEAD_DIM;  // [PARTS] the heads' warps' sums of squares; the softmax's sums
    float* e = part + PARTS;                  // [GQ * CAPACITY] the softmax's numerators
    bf16* ks = (bf16*)(vec + KV_AT);          // [CAPACITY * HEAD_DIM] the cache's keys, then its values
    bf16* vs = ks + CAPACITY * HEAD_DIM;
    const long long cache = (((long long)layer * BATCH + b) * KV_HEADS + j) * CAPACITY * HEAD_DIM;
    const int which = tid / HEAD_DIM, d = tid % HEAD_DIM;  // (q heads 0..GQ-1, then k)
    const bool mine = which < GQ + 1;                       // (v is neither normed nor roped: a loop of its own)
    // the earlier positions' keys and values into shared memory, asked before the wait for q/k/v (the block's
    // own stores of earlier passes: a barrier of the block has passed since)
    for (int v = tid; v < 2 * pos0 * HEAD_DIM / 8; v += THREADS) {
        const int half = v / (pos0 * HEAD_DIM / 8), at = 8 * (v % (pos0 * HEAD_DIM / 8));
        *(uint4*)((half ? vs : ks) + at) = *(const uint4*)((half ? values : keys) + cache + at);
    }
    for (int i = 0; i < tokens; i++) {
        const int pos = pos0 + i, row = b * tokens + i;
        float x = 0.f;
        if (mine) {
            const int col = which < GQ ? (j * GQ + which) * HEAD_DIM : (HEADS + (which - GQ) * KV_HEADS + j) * HEAD_DIM;
            x = take(qkv + row * QKV_W + col + d, epoch);
        }
        for (int dv = tid; dv < HEAD_DIM; dv += THREADS) {  // v: into the cache as it is
            const bf16 v = to_bf(take(qkv + row * QKV_W + (HEADS + KV_HEADS + j) * HEAD_DIM + dv, epoch));
            values[cache + pos * HEAD_DIM + dv] = vs[pos * HEAD_DIM + dv] = v;
        }
        // the head's sum of squares: a warp's lanes, then the warps of a head (HEAD_DIM a power of two)
        float ss = x * x;
        for (int o = 16; o > 0; o >>= 1) {
            const float other = __shfl_xor_sync(0xffffffffu, ss, o);
            if (o < HEAD_DIM) ss += other;
        }
        if (mine && (tid & 31) == 0) part[tid / 32] = ss;
        sync_consumers();
        float total = ss;
        if (HEAD_DIM > 32) {
            total = 0.f;
            for (int w = 0; w < HEAD_DIM / 32; w++) total += part[which * (HEAD_DIM / 32) + w];
        }
        if (mine) {  // q and k: normed (as RMSNorm rounds), then roped below
            const bf16* w = which < GQ ? q_norm + layer * HEAD_DIM : k_norm + layer * HEAD_DIM;
            x = round_bf(bf(w[d]) * round_bf(x * rsqrtf(total / HEAD_DIM + EPS)));
        }
        if (mine) vec[tid] = x;
        sync_consumers();
        if (mine) {
            const float xr = vec[which * HEAD_DIM + (d + HEAD_DIM / 2) % HEAD_DIM];
            x = round_bf(round_bf(x * bf(cos_t[pos * HEAD_DIM + d])) + round_bf(xr * bf(sin_t[pos * HEAD_DIM + d])));
        }
        sync_consumers();
        if (mine) vec[tid] = x;
        if (which == GQ) keys[cache + pos * HEAD_DIM + d] = ks[pos * HEAD_DIM + d] = to_bf(x);
        sync_consumers();
        const int warp = tid >> 5, lane = tid & 31;
        for (int s = warp; s < GQ * (pos + 1); s += WARPS) {  // scores: (q head, position)
            const int g = s / (pos + 1), at = s % (pos + 1);
            float dot = 0.f;
            for (int dd = lane; dd < HEAD_DIM; dd += 32) {
                dot += vec[g * HEAD_DIM + dd] * bf(ks[at * HEAD_DIM + dd]);
            }
            dot = warp_sum(dot);
            if (lane == 0) e[g * CAPACITY + at] = dot * SCALE;
        }
        sync_consumers();
        if (tid < GQ) {  // softmax numerators of head tid; their sum where the position column ends
            float m = NEG_INF;
            for (int at = 0; at <= pos; at++) m = fmaxf(m, e[tid * CAPACITY + at]);
            float sum = 0.f;
            for (int at = 0; at <= pos; at++) {
                const float ex = expf(e[tid * CAPACITY + at] - m);
                e[tid * CAPACITY + at] = ex;
                sum += ex;
            }
            part[tid] = sum;
        }
        sync_consumers();
        if (tid < GQ * HEAD_DIM) {
            const int g = tid / HEAD_DIM;
            float acc = 0.f;
            for (int at = 0; at <= pos; at++) acc += e[g * CAPACITY + at] * bf(vs[at * HEAD_DIM + d]);
            put(out + row * ATTN_W + (j * GQ + g) * HEAD_DIM + d, acc / part[g], epoch);
        }
        sync_consumers();
    }
}

// TRACE: thread 0's global timer (ns) at a step's start, its input read, its weights in, its end: trace
// [blocks, TRACE_ROWS, 4] (a benchmark's timeline; ``CudaCodePredictor.trace``); rows STEPS + p are the draws of
// pass p's codes (their start, the first request's logits read, its top-k / top-p set found, their end)
#define TRACE_ROWS (STEPS + PASSES)
__device__ __forceinline__ void stamp(long long* trace, int step, int phase) {
#if TRACE
    if (threadIdx.x == 0) {
        long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        trace[((long long)blockIdx.x * TRACE_ROWS + step) * 4 + phase] = t;
    }
#endif
}

// ---- the draw: sampling.pick's steps over a request's logits row, in every block ----

__device__ __forceinline__ unsigned long long mix(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ float gumbel(long long seed, long long step, int col) {
    const unsigned long long key = mix((unsigned long long)seed * 0x9E3779B97F4A7C15ull + (unsigned long long)step);
    const unsigned long long z = mix(key + (unsigned long long)(col + 1) * 0x9E3779B97F4A7C15ull);
    const float u = ((float)(z >> 41) + 0.5f) * (1.0f / 8388608.0f);
    return -logf(-logf(u));
}

__device__ __forceinline__ long long key_of(float x, int col) {  // (score desc, index asc); -0.0 == +0.0
    const int bits = __float_as_int(x == 0.f ? 0.f : x);
    const int order = bits ^ ((bits >> 31) & 0x7fffffff);
    return ((long long)order << 32) | (long long)(BLOCK_V - 1 - col);
}

__device__ __forceinline__ float score_of(long long key) {
    const int order = (int)(key >> 32);
    return __int_as_float(order ^ ((order >> 31) & 0x7fffffff));
}

struct Sampling {
    const float* temperature;
    const float* penalty;
    const unsigned char* seen;
    int seen_stride;
    const unsigned char* banned;
    int banned_stride;
    const int* allowed;
    int allowed_stride;
    const long long* top_k;
    const float* top_p;
    const unsigned char* sampled;
    const long long* seeds;
    const long long* steps;
    int flags;
};

// repetition penalty, banned ids, the grammar's bitmask, temperature (``sampling.front``)
__device__ __forceinline__ float front(float x, int row, int col, const Sampling& p) {
    if (p.flags & FLAG_PENALTY) {
        const float penalty = p.penalty[row];
        if (p.seen[(long long)row * p.seen_stride + col]) x = x > 0.f ? __fdiv_rn(x, penalty) : x * penalty;
    }
    if ((p.flags & FLAG_BANNED) && p.banned[(long long)row * p.banned_stride + col]) x = NEG_INF;
    if ((p.flags & FLAG_ALLOWED) && !((p.allowed[(long long)row * p.allowed_stride + (col >> 5)] >> (col & 31)) & 1)) {
        x = NEG_INF;
    }
    return __fdiv_rn(x, p.temperature[row]);
}

// a block's sum over one value a thread (fixed order: lanes, then warps)
__device__ float block_sum(float x, float* red) {
    x = warp_sum(x);
    sync_consumers();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
    sync_consumers();
    float total = 0.f;
    for (int w = 0; w < WARPS; w++) total += red[w];
    return total;
}

// descending bitonic sort of n (a power of two) 64-bit keys in shared memory
__device__ void sort_keys(long long* keys, int n) {
    for (int k = 2; k <= n; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n; i += THREADS) {
                const int other = i ^ j;
                if (other > i) {
                    const long long a = keys[i], b = keys[other];
                    if ((a < b) == ((i & k) == 0)) keys[i] = b, keys[other] = a;
                }
            }
            sync_consumers();
        }
    }
}

#define TOP_FAST (BLOCK_V >= 128 && CANDIDATES == 64 && BLOCK_V / 256 <= WARPS)

// the pair exchange of a descending bitonic network at distance j < 32 for element (t, lane): the lower of
// the pair keeps the larger key where its k-block runs descending
__device__ __forceinline__ long long exchange(long long v, int e, int j, int k) {
    const long long other = __shfl_xor_sync(0xffffffffu, v, j);
    const bool keep_max = ((e & j) == 0) == ((e & k) == 0);
    return keep_max ? max64(v, other) : (v < other ? v : other);
}

// the best CANDIDATES (64) of ``keys`` [BLOCK_V], sorted descending, into ``top`` [BLOCK_V / 2]: each warp sorts
// 128 keys in registers (element t * 32 + lane in register t) and keeps its best 64; then pairs of lists are
// merged (the larger of A[e] and B[63 - e] is bitonic and holds the pair's best 64; a half-cleaner cascade sorts
// it) until one is left, at top[0..63]
__device__ void top_candidates(const long long* keys, long long* top) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int c = warp; c < BLOCK_V / 128; c += WARPS) {
        long long v[4];
#pragma unroll
        for (int t = 0; t < 4; t++) v[t] = keys[c * 128 + t * 32 + lane];
#pragma unroll
        for (int k = 2; k <= 128; k <<= 1) {
#pragma unroll
            for (int j = k >> 1; j > 0; j >>= 1) {
                if (j >= 32) {
                    long long nv[4];
#pragma unroll
                    for (int t = 0; t < 4; t++) {
                        const int e = t * 32 + lane;
                        const bool keep_max = ((e & j) == 0) == ((e & k) == 0);
                        const long long o = v[t ^ (j >> 5)];
                        nv[t] = keep_max ? max64(v[t], o) : (v[t] < o ? v[t] : o);
                    }
#pragma unroll
                    for (int t = 0; t < 4; t++) v[t] = nv[t];
                } else {
#pragma unroll
                    for (int t = 0; t < 4; t++) v[t] = exchange(v[t], t * 32 + lane, j, k);
                }
            }
        }
        top[c * 64 + lane] = v[0];
        top[c * 64 + 32 + lane] = v[1];
    }
    sync_consumers();
    for (int lists = BLOCK_V / 128; lists > 1; lists >>= 1) {
        long long v[2];
        const int pair = warp;
        if (pair < lists / 2) {
            const long long* a = top + 2 * pair * 64;
            const long long* b = a + 64;
            v[0] = max64(a[lane], b[63 - lane]);
            v[1] = max64(a[32 + lane], b[31 - lane]);
            const long long hi = max64(v[0], v[1]);  // (j = 32: the registers)
            v[1] = v[0] < v[1] ? v[0] : v[1];
            v[0] = hi;
#pragma unroll
            for (int j = 16; j > 0; j >>= 1) {
                v[0] = exchange(v[0], lane, j, 128);
                v[1] = exchange(v[1], 32 + lane, j, 128);
            }
        }
        sync_consumers();
        if (pair < lists / 2) {
            top[pair * 64 + lane] = v[0];
            top[pair * 64 + 32 + lane] = v[1];
        }
        sync_consumers();
    }
}

// a request's code from its logits row (``sampling.pick``: front, top-k then top-p, the noise of a sampled
// row, the best with the first index winning ties)
__device__ int draw(const word* logits, int row, int pass, const Sampling& p, Scratch& sc, unsigned int epoch,
                    long long* trace) {
    long long* keys = (long long*)sc.xs;  // [BLOCK_V], then the best candidates' lists [BLOCK_V / 2]
    float* red = sc.red;
    const int tid = threadIdx.x;
    for (int c = tid; c < BLOCK_V; c += THREADS) {
        const float x = c < VOCAB ? front(take(logits + row * VOCAB + c, epoch), row, c, p) : NEG_INF;
        keys[c] = key_of(x, c);
    }
    sync_consumers();
    if (row == blockIdx.x % BATCH) stamp(trace, STEPS + pass, 1);  // (the block's own request or, at one, request 0)
    long long smallest = KEY_MIN;  // the least key the top-k / top-p set keeps
    bool kept_keys = true;         // keys[c] still column c's (the full sort ranks them in place)
    const long long top_k = (p.flags & FLAG_TOP) ? p.top_k[row] : VOCAB;
    const float top_p = (p.flags & FLAG_TOP) ? p.top_p[row] : 1.f;
    if (top_k < VOCAB || top_p < 1.f) {
        const int n = top_k <= CANDIDATES ? CANDIDATES : BLOCK_V;
        long long* ranked = keys;  // the keys by rank, descending (n of them)
        if (TOP_FAST && n == CANDIDATES) {
            ranked = keys + BLOCK_V;
            top_candidates(keys, ranked);
        } else {
            sort_keys(keys, BLOCK_V);
            kept_keys = false;
        }
        const int per = (n + THREADS - 1) / THREADS, r0 = tid * per;
        const float best = score_of(ranked[0]);
        float mass = 0.f;  // this thread's ranks' summed probabilities, after the total is known
        float ex[BLOCK_V / THREADS + 1];
        float sum_e = 0.f;
        for (int i = 0; i < per; i++) {
            const int r = r0 + i;
            ex[i] = (r < n && r < top_k) ? expf(score_of(ranked[r]) - best) : 0.f;
            sum_e += ex[i];
        }
        const float total = block_sum(sum_e, red);
        for (int i = 0; i < per; i++) ex[i] = ex[i] / total, mass += ex[i];
        // exclusive scan of the threads' masses (warp scan, then the warps' totals)
        float incl = mass;
        for (int o = 1; o < 32; o <<= 1) {
            const float y = __shfl_up_sync(0xffffffffu, incl, o);
            if ((tid & 31) >= o) incl += y;
        }
        sync_consumers();
        if ((tid & 31) == 31) red[tid >> 5] = incl;
        sync_consumers();
        float before = incl - mass;
        for (int w = 0; w < (tid >> 5); w++) before += red[w];
        const float limit = top_p < 1.f ? top_p : POS_INF;
        int first_drop = n;
        for (int i = 0; i < per; i++) {
            const int r = r0 + i;
            if (r < n && (((before >= limit) && r > 0) || r >= top_k)) { first_drop = r; break; }
            before += ex[i];
        }
        sync_consumers();
        int* kept = (int*)red;
        if (tid == 0) kept[0] = n;
        sync_consumers();
        if (first_drop < n) atomicMin(kept, first_drop);
        sync_consumers();
        smallest = ranked[kept[0] - 1];
        sync_consumers();
    }
    if (row == blockIdx.x % BATCH) stamp(trace, STEPS + pass, 2);
    long long best = KEY_MIN;
    const bool noise = (p.flags & FLAG_SAMPLED) && p.sampled[row];
    for (int c = tid; c < BLOCK_V; c += THREADS) {
        float x = kept_keys ? score_of(keys[c]) : c < VOCAB ? front(take(logits + row * VOCAB + c, epoch), row, c, p)
                                                            : NEG_INF;
        if (key_of(x, c) < smallest) x = NEG_INF;
        if (noise) x += gumbel(p.seeds[row], p.steps[row] + pass, c);
        best = max64(best, key_of(x, c));
    }
    best = warp_max64(best);
    sync_consumers();
    long long* bests = (long long*)(sc.red);
    if ((tid & 31) == 0) bests[tid >> 5] = best;
    sync_consumers();
    best = bests[0];
    for (int w = 1; w < WARPS; w++) best = max64(best, bests[w]);
    sync_consumers();
    return BLOCK_V - 1 - (int)(best & 0xffffffffll);
}

// request b's code of pass ``pass`` out: into the codes and its embedding added to the request's running sum
__device__ __forceinline__ void write_code(int b, int code, int pass, const bf16* embeds, long long* codes,
                                           bf16* total) {
    if (threadIdx.x == 0) codes[b * PASSES + pass] = code;
    for (int c = threadIdx.x; c < HIDDEN; c += THREADS) {
        const float e = bf(embeds[((long long)pass * VOCAB + code) * HIDDEN + c]);
        total[b * HIDDEN + c] = to_bf(bf(total[b * HIDDEN + c]) + e);
    }
}

// (a call where blocks draw one request each: its registers apart from the steps', which then spill less; at
// one request the steps' allocation is the better one inlined)
#if BATCH > 1
#define DRAW_PASS __noinline__
#else
#define DRAW_PASS
#endif

// a pass's codes, drawn from its logits into sc.codes (the next pass's input, where ``next``), each written out
// once (``write_code``). One request: every block draws it, block 0 writes it. More: block b < BATCH draws
// request b's, writes it and puts it in the pass's code words; the blocks that go on take them all from there.
__device__ DRAW_PASS void draw_pass(word* words, int pass, bool next, const bf16* embeds, long long* codes,
                                    bf16* total, const Sampling& sp, Scratch& sc, unsigned int epoch,
                                    long long* trace) {
    const word* logits = words + (long long)pass * PASS_WORDS + LAYERS * LAYER_WORDS;
    word* code_words = words + (long long)pass * PASS_WORDS + AT_CODES;
    const int block = blockIdx.x;
    stamp(trace, STEPS + pass, 0);
    if (BATCH == 1) {
        const int code = draw(logits, 0, pass, sp, sc, epoch, trace);
        if (threadIdx.x == 0) sc.codes[0] = code;
        if (block == 0) write_code(0, code, pass, embeds, codes, total);
    } else {
        if (block < BATCH) {
            const int code = draw(logits, block, pass, sp, sc, epoch, trace);
            if (threadIdx.x == 0) put_code(code_words + block, code, epoch);
            write_code(block, code, pass, embeds, codes, total);
        } else if (next) {
            stamp(trace, STEPS + pass, 1);  // (a block that draws none: its phases are the wait for the codes)
            stamp(trace, STEPS + pass, 2);
        }
        if (next && threadIdx.x < BATCH) sc.codes[threadIdx.x] = (int)take_bits(code_words + threadIdx.x, epoch);
    }
    sync_consumers();
    stamp(trace, STEPS + pass, 3);
}

// a step's projection: the block's ``n`` rows of it (SEGS segments of n rows, K inputs each: gate and up are
// two) times the step's input rows in xs; lane r of the warp that computes row i hands row r's sums to
// ``out(i, r, part 0's sum, part 1's)``. Stamps the step's weights in and its end.
template <int SEGS, int K, typename Out>
__device__ __forceinline__ void project(Ring* ring, int n, int rows, const Scratch& sc,
                                        long long* trace, int step, Out out) {
    const int chunks = chunks_of(n * K * 2), lane = threadIdx.x & 31;
    arrive(ring, SEGS * chunks);
    stamp(trace, step, 2);
    float acc[ROWS0], acc2[ROWS0];
    for (int i = threadIdx.x >> 5; i < n; i += WARPS) {
        const int at = (int)(ring->begin % RING_CHUNKS) * CHUNK + i * K * 2;
        row_times_inputs<K>(ring->slots, at, rows, sc.xs, acc);
        if (SEGS == 2) row_times_inputs<K>(ring->slots, (at + chunks * CHUNK) % RING, rows, sc.xs, acc2);
        if (lane < rows) out(i, lane, lane_row(acc), SEGS == 2 ? lane_row(acc2) : 0.f);
    }
    sync_consumers();
    release(ring, SEGS * chunks);
    stamp(trace, step, 3);
}

// ---- the frame ----

extern "C" __global__ void __launch_bounds__(THREADS + 32, 1)  // (and the copy warp: 16 warps, 128 registers)
code_predictor_frame(const bf16* __restrict__ in_norm, const bf16* __restrict__ qkv_w,
                     const bf16* __restrict__ q_norm, const bf16* __restrict__ k_norm, const bf16* __restrict__ o_w,
                     const bf16* __restrict__ post_norm, const bf16* __restrict__ gate_up_w,
                     const bf16* __restrict__ down_w, const bf16* __restrict__ final_norm,
                     const bf16* __restrict__ heads, const bf16* __restrict__ embeds, const bf16* __restrict__ cos_t,
                     const bf16* __restrict__ sin_t, const bf16* __restrict__ x0, word* words, bf16* keys,
                     bf16* values, long long* codes, bf16* total, unsigned int* sync,
                     const float* temperature, const float* penalty, const unsigned char* seen, int seen_stride,
                     const unsigned char* banned, int banned_stride, const int* allowed, int allowed_stride,
                     const long long* top_k, const float* top_p, const unsigned char* sampled,
                     const long long* seeds, const long long* steps, int flags, long long* trace)
{
    extern __shared__ __align__(16) unsigned char smem[];
    Scratch sc;
    sc.xs = (bf16*)(smem + RING);
    unsigned long long* full = (unsigned long long*)(smem + RING + SCRATCH);  // the slots' barriers (Ring)
    unsigned long long* empty = full + RING_CHUNKS;
    sc.red = (float*)(empty + RING_CHUNKS);
    sc.rstd = sc.red + WARPS * ROWS0;
    sc.codes = (int*)(sc.rstd + ROWS0);
    sc.res = (float*)(sc.codes + BATCH);
    const int tid = threadIdx.x, block = blockIdx.x;
    const unsigned int epoch = load_word(sync) % 65535u + 1u;  // (1..65535: 0 is a word never written)
    if (tid == 0) {
        give_up = sync + 2;  // (every block the same value)
        for (int i = 0; i < 2 * RING_CHUNKS; i++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(shared_address(full + i)) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // (seen by the copy engine)
    }
    __syncthreads();  // (the whole block, the copy warp too: the barriers are ready)
    const Weights w = {qkv_w, o_w, gate_up_w, down_w, heads};
    if (tid >= THREADS) {  // the copy warp: one thread streams the weights; the others have nothing to do
        if (tid == THREADS) produce(w, smem, full, empty);
        return;
    }
    const Sampling sp = {temperature, penalty, seen, seen_stride, banned, banned_stride, allowed, allowed_stride,
                         top_k, top_p, sampled, seeds, steps, flags};
    Ring ring;
    ring.slots = smem, ring.full = full, ring.empty = empty, ring.begin = 0;
    // the block's rows of each projection (the same every pass)
    const int q0 = share_start(QKV_W, block), q1 = share_start(QKV_W, block + 1);
    const int h0 = share_start(HIDDEN, block), h1 = share_start(HIDDEN, block + 1);
    const int i0 = share_start(INTERMEDIATE, block), i1 = share_start(INTERMEDIATE, block + 1);
    const int v0 = share_start(VOCAB, block), v1 = share_start(VOCAB, block + 1);
    const int attn_tile = gridDim.x - 1 - block;  // (the last BATCH * KV_HEADS blocks attend)
    for (int pass = 0; pass < PASSES; pass++) {
        word* pw = words + (long long)pass * PASS_WORDS;
        const int rows = pass == 0 ? ROWS0 : BATCH, tokens = pass == 0 ? 2 : 1;
        if (pass > 0) draw_pass(words, pass - 1, true, embeds, codes, total, sp, sc, epoch, trace);  // (its input)
        for (int layer = 0; layer < LAYERS; layer++) {
            word* lw = pw + layer * LAYER_WORDS;
            const word* res_in = layer == 0 ? nullptr : lw - LAYER_WORDS + AT_RES_M;  // (null: the pass's input)
            const int step = pass * (5 * LAYERS + 1) + 5 * layer;
            // QKV
            stamp(trace, step, 0);
            read_rows(res_in, HIDDEN, 0, 1, rows, HIDDEN, in_norm + layer * HIDDEN, x0, embeds, pass, sc, epoch);
            stamp(trace, step, 1);
            project<1, HIDDEN>(&ring, q1 - q0, rows, sc, trace, step, [&](int i, int r, float y, float) {
                put(lw + AT_QKV + r * QKV_W + q0 + i, y, epoch);
            });
            // ATTN
            stamp(trace, step + 1, 0);
            if (attn_tile < BATCH * KV_HEADS) {
                attend(pw, layer, attn_tile, pass, q_norm, k_norm, cos_t, sin_t, keys, values, sc, epoch);
            }
            stamp(trace, step + 1, 3);
            // OUT (+ the residual)
            stamp(trace, step + 2, 0);
            residual_at(res_in, h0, h1, rows, x0, embeds, pass, sc, epoch);
            read_rows(lw + AT_ATTN, ATTN_W, 0, 1, rows, ATTN_W, nullptr, x0, embeds, pass, sc, epoch);
            stamp(trace, step + 2, 1);
            project<1, ATTN_W>(&ring, h1 - h0, rows, sc, trace, step + 2, [&](int i, int r, float y, float) {
                put(lw + AT_RES_A + r * HIDDEN + h0 + i, sc.res[r * RES_COLS + i] + round_bf(y), epoch);
            });
            // GATE_UP
            stamp(trace, step + 3, 0);
            read_rows(lw + AT_RES_A, HIDDEN, 0, 1, rows, HIDDEN, post_norm + layer * HIDDEN, x0, embeds, pass, sc,
                      epoch);
            stamp(trace, step + 3, 1);
            project<2, HIDDEN>(&ring, i1 - i0, rows, sc, trace, step + 3, [&](int i, int r, float gate, float up) {
                const float g = round_bf(gate);
                put(lw + AT_ACT + r * INTERMEDIATE + i0 + i, round_bf(g / (1.f + expf(-g))) * round_bf(up), epoch);
            });
            // DOWN (+ the residual)
            stamp(trace, step + 4, 0);
            residual_at(lw + AT_RES_A, h0, h1, rows, x0, embeds, pass, sc, epoch);
            read_rows(lw + AT_ACT, INTERMEDIATE, 0, 1, rows, INTERMEDIATE, nullptr, x0, embeds, pass, sc, epoch);
            stamp(trace, step + 4, 1);
            project<1, INTERMEDIATE>(&ring, h1 - h0, rows, sc, trace, step + 4, [&](int i, int r, float y, float) {
                put(lw + AT_RES_M + r * HIDDEN + h0 + i, sc.res[r * RES_COLS + i] + round_bf(y), epoch);
            });
        }
        // HEAD: each request's last token row, final-normed
        const int head_step = pass * (5 * LAYERS + 1) + 5 * LAYERS;
        stamp(trace, head_step, 0);
        const word* last = pw + (LAYERS - 1) * LAYER_WORDS + AT_RES_M;
        read_rows(last, HIDDEN, tokens - 1, tokens, BATCH, HIDDEN, final_norm, x0, embeds, pass, sc, epoch);
        stamp(trace, head_step, 1);
        project<1, HIDDEN>(&ring, v1 - v0, BATCH, sc, trace, head_step, [&](int i, int r, float y, float) {
            put(pw + LAYERS * LAYER_WORDS + r * VOCAB + v0 + i, y, epoch);
        });
    }
    if (block < BATCH) draw_pass(words, PASSES - 1, false, embeds, codes, total, sp, sc, epoch, trace);
    // the last block out moves the epoch on (the next launch reads it)
    sync_consumers();
    if (tid == 0) {
        __threadfence();
        if (atomicAdd(sync + 1, 1u) == gridDim.x - 1) {
            sync[1] = 0;
            atomicAdd(sync, 1u);
        }
    }
}
