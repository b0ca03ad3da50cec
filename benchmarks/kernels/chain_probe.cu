// The kernels of benchmarks/kernels/chain_probe.py (issue 41's probe), built at first use by NVRTC through
// torch.cuda. The script prepends their settings as #defines: CHUNK, RING_CHUNKS, DEPTH, THREADS, CONSUMERS,
// WAIT, FLAGS, BULK, HINT, TRACE, STREAM, COMPUTE, YMAX, XMAX, MAX_STEPS, EPS (the script's docstring says what
// each variant does). Both kernels are built each time; the script launches the one it asked for.
#define RING (CHUNK * RING_CHUNKS)
#define NC (CONSUMERS * 32)

__device__ __forceinline__ unsigned int load_acquire(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void add_release(unsigned int* p, unsigned int n) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" :: "l"(p), "r"(n) : "memory");
}

__device__ __forceinline__ float4 load_cg4(const float* p) {  // past L1 (written by other SMs)
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned int shared_address(const void* p) {
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (unsigned int)a;
}

__device__ __forceinline__ void bar_wait(unsigned long long* bar, unsigned int parity) {
    const unsigned int at = shared_address(bar);
    unsigned int done = 0;
    while (!done) {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(at), "r"(parity) : "memory");
    }
}

__device__ __forceinline__ long long global_ns() {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ float bf16_lo(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.f + __expf(-g)) * u; }

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// FLAGS: each output entry travels with the epoch of the launch that wrote it (a pair of 32-bit words, stored
// and loaded whole), so the load that reads a step's input is also its wait: no fence, no counter
__device__ __forceinline__ uint4 load_volatile4(const float* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_flagged(float* p, float value, unsigned int epoch) {
    asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" :: "l"(p), "r"(__float_as_uint(value)), "r"(epoch)
                 : "memory");
}

// the four entries from ``p`` (entry i at p[2 i], its epoch at p[2 i + 1]) once ``epoch`` wrote them (0: as
// they are)
__device__ __forceinline__ float4 load_flagged4(const float* p, unsigned int epoch) {
    uint4 a, b;
    do { a = load_volatile4(p); } while (epoch && (a.y != epoch || a.w != epoch));
    do { b = load_volatile4(p + 4); } while (epoch && (b.y != epoch || b.w != epoch));
    return make_float4(__uint_as_float(a.x), __uint_as_float(a.z), __uint_as_float(b.x), __uint_as_float(b.z));
}

// the four entries of ``yp`` from entry ``i`` (FLAGS: flagged pairs, waited for unless ``epoch`` is 0)
__device__ __forceinline__ float4 load_entries(const float* yp, int i, unsigned int epoch) {
#if FLAGS
    return load_flagged4(yp + 2 * i, epoch);
#else
    return load_cg4(yp + i);
#endif
}

// a step's input into ``xs``: the step before's output ``yp`` (after gate/up: silu(gate) * up), float4s
// first, first + stride, ... (one L2 round trip: K / 4 <= 768 vectors); -> this thread's sum of its squares
__device__ __forceinline__ float read_input(const float* yp, int K, int kind, float* xs, int first, int stride,
                                            unsigned int epoch = 0) {
    float ss = 0.f;
    for (int v = first; COMPUTE && v < K / 4; v += stride) {
        float4 a = load_entries(yp, 4 * v, epoch);
        if (kind) {
            const float4 u = load_entries(yp, K + 4 * v, epoch);
            a = make_float4(silu_times(a.x, u.x), silu_times(a.y, u.y), silu_times(a.z, u.z), silu_times(a.w, u.w));
        }
        *(float4*)(xs + 4 * v) = a;
        ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    }
    return ss;
}

// ---- chain_frame: every thread streams and computes ----

// a step's share of a block (made on the host, held in shared memory): x its first weight (elements),
// y rows | first row << 16, z K | kind << 16, w the step's N
struct Stream {  // the block's next chunk to ask for: a step and a byte offset into its rows
    int step;
    int offset;
};

// ask for the block's next chunk into ring slot ``slot`` (BULK: one copy by thread 0 through the bulk copy
// engine, completing on the slot's barrier; else 16 bytes a thread with cp.async, one group a chunk, an
// empty group past the frame's end)
__device__ __forceinline__ void ask(const unsigned short* arena, const int4* share, int num_steps,
                                    Stream* st, int slot, unsigned char* ring, unsigned long long* bars,
                                    unsigned long long policy) {
    if (st->step < num_steps) {
        const int4 h = share[st->step];
        const int bytes = (h.y & 0xffff) * (h.z & 0xffff) * 2;
        const int left = min(bytes - st->offset, CHUNK);
        const unsigned char* src = (const unsigned char*)(arena + h.x) + st->offset;
        const unsigned int dst = shared_address(ring + slot * CHUNK);
#if BULK
        if (threadIdx.x == 0) {
            const unsigned int bar = shared_address(bars + slot);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(left) : "memory");
#if HINT
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                         " [%0], [%1], %2, [%3], %4;" :: "r"(dst), "l"(src), "r"(left), "r"(bar), "l"(policy)
                         : "memory");
#else
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         :: "r"(dst), "l"(src), "r"(left), "r"(bar) : "memory");
#endif
        }
#else
        for (int o = threadIdx.x * 16; o < left; o += THREADS * 16) {
#if HINT
            asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;"
                         :: "r"(dst + o), "l"(src + o), "l"(policy) : "memory");
#else
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst + o), "l"(src + o) : "memory");
#endif
        }
#endif
        st->offset += CHUNK;
        if (st->offset >= bytes) { st->step += 1; st->offset = 0; }
    }
#if !BULK
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// until chunk ``c`` is in its slot (BULK: every thread waits on the slot's barrier, phase c / RING_CHUNKS)
__device__ __forceinline__ void arrived(long long c, unsigned long long* bars) {
#if BULK
    bar_wait(bars + c % RING_CHUNKS, (unsigned int)(c / RING_CHUNKS) & 1u);
#else
    asm volatile("cp.async.wait_group %0;" :: "n"(DEPTH) : "memory");
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
chain_frame(const unsigned short* __restrict__ arena, const int4* __restrict__ shares, int num_steps,
            float* ys, unsigned int* counters, int epoch, long long* trace)
{
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char* ring = smem;
    float* xs = (float*)(smem + RING);
    float* red = xs + XMAX;
    int4* share = (int4*)(red + 32);
    unsigned long long* bars = (unsigned long long*)(share + MAX_STEPS);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const unsigned int target = (unsigned int)epoch * gridDim.x;
    for (int s = tid; s < num_steps; s += THREADS) share[s] = shares[s * gridDim.x + blockIdx.x];  // (once)
#if BULK
    if (tid == 0) {
        for (int i = 0; i < RING_CHUNKS; i++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(shared_address(bars + i)) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
#endif
    __syncthreads();
    unsigned long long policy = 0;  // (HINT: the weights are read once a pass; evicted first from L2)
#if HINT
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
    // TRACE: thread 0's clock at each step's start, weights in, wait over, input and norm read, rows written
    // ([blocks, steps + 1, 5]; the last row: the clock and the global timer at the start and the end)
    long long* stamps = trace + (long long)blockIdx.x * (num_steps + 1) * 5;
    const bool tracing = TRACE && tid == 0;
    const long long clock0 = clock64(), ns0 = global_ns();
    Stream st = {0, 0};
    long long asked = 0, resident = 0, begin = 0;  // chunks asked for, arrived, the step's first
    for (int i = 0; i < DEPTH; i++) {
        ask(arena, share, num_steps, &st, asked % RING_CHUNKS, ring, bars, policy);
        asked++;
    }
    for (int s = 0; s < num_steps; s++) {
        if (tracing) stamps[5 * s] = clock64();
        const int4 h = share[s];
        const int K = h.z & 0xffff, kind = h.z >> 16, rows = h.y & 0xffff;
        const int chunks = (rows * K * 2 + CHUNK - 1) / CHUNK;
        while (STREAM && resident < begin + chunks) {  // the step's rows in the ring; DEPTH chunks in flight
            ask(arena, share, num_steps, &st, asked % RING_CHUNKS, ring, bars, policy);
            asked++;
            arrived(resident, bars);
            resident++;
        }
        if (tracing) stamps[5 * s + 1] = clock64();
        if (WAIT && !FLAGS && s > 0 && tid == 0) {
            while (load_acquire(counters + s - 1) < target) { }
        }
        __syncthreads();
        if (tracing) stamps[5 * s + 2] = clock64();
        const float* yp = ys + (long long)s * YMAX * (FLAGS + 1);
        const unsigned int flag = WAIT && FLAGS && s > 0 ? (unsigned int)epoch : 0u;  // (step 0: the host's)
        const float ss = warp_sum(read_input(yp, K, kind, xs, tid, THREADS, flag));
        if (lane == 0) red[warp] = ss;
        __syncthreads();
        if (tracing) stamps[5 * s + 3] = clock64();
        float total = 0.f;
        for (int w = 0; w < THREADS / 32; w++) total += red[w];
        const float rstd = rsqrtf(total / K + EPS);
        const int base = (int)(begin % RING_CHUNKS) * CHUNK;
        for (int i = warp; COMPUTE && i < rows; i += THREADS / 32) {
            int row = base + i * K * 2;
            if (row >= RING) row -= RING;
            float acc = 0.f;
            for (int k = lane * 8; k < K; k += 256) {
                int at = row + 2 * k;
                if (at >= RING) at -= RING;
                uint4 w = *(const uint4*)(ring + at);
                const float4 a = *(const float4*)(xs + k), c = *(const float4*)(xs + k + 4);
                acc += bf16_lo(w.x) * a.x + bf16_hi(w.x) * a.y + bf16_lo(w.y) * a.z + bf16_hi(w.y) * a.w;
                acc += bf16_lo(w.z) * c.x + bf16_hi(w.z) * c.y + bf16_lo(w.w) * c.z + bf16_hi(w.w) * c.w;
            }
            acc = warp_sum(acc);
#if FLAGS
            if (lane == 0) store_flagged(ys + 2 * ((long long)(s + 1) * YMAX + (h.y >> 16) + i), acc * rstd, epoch);
#else
            if (lane == 0) ys[(long long)(s + 1) * YMAX + (h.y >> 16) + i] = acc * rstd;
#endif
        }
        __syncthreads();
        if (tracing) stamps[5 * s + 4] = clock64();
        if (!FLAGS && tid == 0) add_release(counters + s, 1u);
        begin += chunks;
    }
    if (tracing) {
        const long long clock1 = clock64(), ns1 = global_ns();
        stamps[5 * num_steps] = clock0;
        stamps[5 * num_steps + 1] = clock1;
        stamps[5 * num_steps + 2] = ns0;
        stamps[5 * num_steps + 3] = ns1;
    }
#if !BULK
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}

// ---- chain_ws: a producer warp streams, the consumer warps compute ----

__device__ __forceinline__ void bar_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(shared_address(bar)) : "memory");
}

__device__ __forceinline__ void consumers_sync() {  // the consumer warps alone (the producer runs on)
    asm volatile("bar.sync 1, %0;" :: "n"(NC) : "memory");
}

// CONSUMERS warps compute the steps; one more warp streams the block's rows of every step into the ring
// (one bulk copy a chunk, completing on the slot's ``full`` barrier), reusing a slot once every consumer
// warp has arrived on its ``empty`` barrier. A block counts its rows of a step in once they are written.
extern "C" __global__ void __launch_bounds__(NC + 32, 1)
chain_ws(const unsigned short* __restrict__ arena, const int4* __restrict__ shares, int num_steps,
         float* ys, unsigned int* counters, int epoch)
{
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char* ring = smem;
    float* xs = (float*)(smem + RING);
    float* red = xs + XMAX;
    int4* share = (int4*)(red + 32);
    unsigned long long* full = (unsigned long long*)(share + MAX_STEPS);
    unsigned long long* empty = full + RING_CHUNKS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int s = tid; s < num_steps; s += blockDim.x) share[s] = shares[s * gridDim.x + blockIdx.x];
    if (tid == 0) {
        for (int i = 0; i < RING_CHUNKS; i++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(shared_address(full + i)) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(shared_address(empty + i)), "n"(CONSUMERS)
                         : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    if (warp == CONSUMERS) {  // the producer
        if (lane == 0 && STREAM) {
            int c = 0;
            for (int s = 0; s < num_steps; s++) {
                const int4 h = share[s];
                const int bytes = (h.y & 0xffff) * (h.z & 0xffff) * 2;
                const unsigned char* src = (const unsigned char*)(arena + h.x);
                for (int offset = 0; offset < bytes; offset += CHUNK, c++) {
                    const int slot = c % RING_CHUNKS;
                    if (c >= RING_CHUNKS) bar_wait(empty + slot, (unsigned int)(c / RING_CHUNKS - 1) & 1u);
                    const int n = min(CHUNK, bytes - offset);
                    const unsigned int bar = shared_address(full + slot);
                    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                                 :: "r"(bar), "r"(n) : "memory");
                    asm volatile(
                        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                        :: "r"(shared_address(ring + slot * CHUNK)), "l"(src + offset), "r"(n), "r"(bar) : "memory");
                }
            }
        }
        return;
    }
    int begin = 0;  // the step's first chunk
    for (int s = 0; s < num_steps; s++) {
        const int4 h = share[s];
        const int K = h.z & 0xffff, kind = h.z >> 16, rows = h.y & 0xffff;
        const int chunks = (rows * K * 2 + CHUNK - 1) / CHUNK;
        if (WAIT && s > 0 && lane == 0) {
            const unsigned int target = (unsigned int)epoch * (unsigned int)share[s - 1].w;
            while (load_acquire(counters + s - 1) < target) { }
        }
        consumers_sync();  // (also: every warp done with the step before's xs and red)
        const float* yp = ys + (long long)s * YMAX;
        const float ss = warp_sum(read_input(yp, K, kind, xs, tid, NC));
        if (lane == 0) red[warp] = ss;
        for (int i = 0; STREAM && i < chunks; i++) {
            bar_wait(full + (begin + i) % RING_CHUNKS, (unsigned int)((begin + i) / RING_CHUNKS) & 1u);
        }
        consumers_sync();
        const float total = warp_sum(lane < CONSUMERS ? red[lane] : 0.f);  // (every warp sums the warps' parts)
        const float rstd = rsqrtf(total / K + EPS);
        const int base = (begin % RING_CHUNKS) * CHUNK;
        for (int i = warp; COMPUTE && i < rows; i += CONSUMERS) {
            int row = base + i * K * 2;
            if (row >= RING) row -= RING;
            float acc = 0.f, acc2 = 0.f;  // (two chains of adds; the loads of 4 iterations in flight)
#pragma unroll 4
            for (int k = lane * 8; k < K; k += 256) {
                int at = row + 2 * k;
                if (at >= RING) at -= RING;
                uint4 w = *(const uint4*)(ring + at);
                const float4 a = *(const float4*)(xs + k), c = *(const float4*)(xs + k + 4);
                acc += bf16_lo(w.x) * a.x + bf16_hi(w.x) * a.y + bf16_lo(w.y) * a.z + bf16_hi(w.y) * a.w;
                acc2 += bf16_lo(w.z) * c.x + bf16_hi(w.z) * c.y + bf16_lo(w.w) * c.z + bf16_hi(w.w) * c.w;
            }
            acc += acc2;
            acc = warp_sum(acc);
            if (lane == 0) ys[(long long)(s + 1) * YMAX + (h.y >> 16) + i] = acc * rstd;
        }
        __syncwarp();
        if (lane == 0) {
            for (int i = 0; STREAM && i < chunks; i++) bar_arrive(empty + (begin + i) % RING_CHUNKS);
        }
        consumers_sync();  // (one count a block: a count a warp put ~16x the atomics on the counter)
        if (tid == 0) add_release(counters + s, (unsigned int)rows);
        begin += chunks;
    }
}
