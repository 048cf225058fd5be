// Standalone vector add against the HIP runtime: the study's first program, made trustworthy.
//
// Unlike the tutorial's version it checks every runtime call and every kernel launch, verifies every
// element of every result against the host (outputs are poisoned with NaN first, so an unwritten
// element fails), launches any length (grid-stride loop with 16-byte loads and a scalar tail, not
// one block of n threads), times the kernel with device events (warm-up, cache flush between
// repetitions, all samples printed), and exits non-zero on any error or wrong element.
//
// Usage: vector_add [--sizes N,N,...] [--min-time-ms T] [--min-reps R] [--max-reps R] [--warmup W]
//                   [--flush-mib M]
// Output (stdout, one line each, parsed by gpulab.native.hip_standalone):
//   DEVICE,<name>,<arch>,<warp size>,<multiprocessors>,<runtime>
//   RESULT,<n>,<correct 0|1>,<mismatches>,<first call ms>,<sample ms>;<sample ms>;...
// Exit status: 0 all correct, 1 runtime error (including no GPU), 2 wrong results, 64 bad usage.
#include "hip_compat.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

enum ExitStatus { EXIT_OK = 0, EXIT_RUNTIME_ERROR = 1, EXIT_WRONG_RESULT = 2, EXIT_USAGE = 64 };

#define HIP_CHECK(call)                                                                            \
    do {                                                                                           \
        hipError_t err_ = (call);                                                                  \
        if (err_ != hipSuccess) {                                                                  \
            std::fprintf(stderr, GPULAB_RUNTIME " error %s (%d): %s\n  at %s:%d in %s\n", hipGetErrorName(err_), \
                         static_cast<int>(err_), hipGetErrorString(err_), __FILE__, __LINE__, #call); \
            std::exit(EXIT_RUNTIME_ERROR);                                                         \
        }                                                                                          \
    } while (0)

// A launch reports configuration errors only through the last-error state.
#define HIP_CHECK_LAUNCH() HIP_CHECK(hipGetLastError())

constexpr int kThreads = 256;

__global__ void vector_add_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                  float* __restrict__ c, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    // hipMalloc returns 256-byte aligned memory, so the float4 body is aligned; the tail is scalar.
    const int64_t n4 = n / 4;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    const float4* b4 = reinterpret_cast<const float4*>(b);
    float4* c4 = reinterpret_cast<float4*>(c);
    for (int64_t i = first; i < n4; i += stride) {
        const float4 x = a4[i];
        const float4 y = b4[i];
        c4[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
    for (int64_t i = n4 * 4 + first; i < n; i += stride) c[i] = a[i] + b[i];
}

static std::vector<int64_t> parse_sizes(const char* text) {
    std::vector<int64_t> sizes;
    std::string s(text);
    size_t pos = 0;
    while (pos <= s.size()) {
        size_t comma = s.find(',', pos);
        std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        char* end = nullptr;
        long long v = std::strtoll(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || v <= 0) {
            std::fprintf(stderr, "bad size '%s' in --sizes (positive integers, comma separated)\n", item.c_str());
            std::exit(EXIT_USAGE);
        }
        sizes.push_back(v);
        if (comma == std::string::npos) break;
        pos = comma + 1;
    }
    return sizes;
}

static double parse_number(const char* flag, const char* text) {
    char* end = nullptr;
    double v = std::strtod(text, &end);
    if (*end != '\0' || v < 0) {
        std::fprintf(stderr, "bad value '%s' for %s\n", text, flag);
        std::exit(EXIT_USAGE);
    }
    return v;
}

// Deterministic, non-trivial inputs: distinct values, both signs, no zeros hiding unwritten output.
static float input_value(int64_t i, uint32_t salt) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ salt;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (static_cast<float>(h & 0xFFFFFF) / 16777216.0f - 0.5f) * 8.0f + 0.001f;
}

struct Options {
    std::vector<int64_t> sizes{1024, 98432, 1048576, 16777216, 67108864};
    double min_time_ms = 250.0;
    int min_reps = 10;
    int max_reps = 1000;
    int warmup = 3;
    double flush_mib = 512.0;
};

static Options parse_args(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string flag = argv[i];
        if (i + 1 >= argc) {
            std::fprintf(stderr, "missing value for %s\n", flag.c_str());
            std::exit(EXIT_USAGE);
        }
        const char* value = argv[++i];
        if (flag == "--sizes") o.sizes = parse_sizes(value);
        else if (flag == "--min-time-ms") o.min_time_ms = parse_number(flag.c_str(), value);
        else if (flag == "--min-reps") o.min_reps = static_cast<int>(parse_number(flag.c_str(), value));
        else if (flag == "--max-reps") o.max_reps = static_cast<int>(parse_number(flag.c_str(), value));
        else if (flag == "--warmup") o.warmup = static_cast<int>(parse_number(flag.c_str(), value));
        else if (flag == "--flush-mib") o.flush_mib = parse_number(flag.c_str(), value);
        else {
            std::fprintf(stderr, "unknown option %s\n", flag.c_str());
            std::exit(EXIT_USAGE);
        }
    }
    if (o.min_reps < 1 || o.max_reps < o.min_reps) {
        std::fprintf(stderr, "need 1 <= --min-reps <= --max-reps\n");
        std::exit(EXIT_USAGE);
    }
    return o;
}

int main(int argc, char** argv) {
    const Options opt = parse_args(argc, argv);

    int count = 0;
    HIP_CHECK(hipGetDeviceCount(&count));  // no GPU / no driver fails here, loudly
    if (count < 1) {
        std::fprintf(stderr, "no GPU device visible to the %s runtime\n", GPULAB_RUNTIME);
        return EXIT_RUNTIME_ERROR;
    }
    HIP_CHECK(hipSetDevice(0));
    hipDeviceProp_t prop;
    HIP_CHECK(hipGetDeviceProperties(&prop, 0));
    char arch[64];
    gpulab_arch_name(prop, arch, sizeof arch);
    std::string name = prop.name;
    for (char& ch : name) if (ch == ',') ch = ' ';
    std::printf("DEVICE,%s,%s,%d,%d,%s\n", name.c_str(), arch, prop.warpSize, prop.multiProcessorCount,
                GPULAB_RUNTIME);
    std::fflush(stdout);

    // Overwritten before each timed repetition so no repetition reads the previous one's cache lines.
    const size_t flush_bytes = static_cast<size_t>(opt.flush_mib * 1024 * 1024);
    void* flush = nullptr;
    if (flush_bytes > 0) HIP_CHECK(hipMalloc(&flush, flush_bytes));

    hipEvent_t start, stop;
    HIP_CHECK(hipEventCreate(&start));
    HIP_CHECK(hipEventCreate(&stop));

    bool all_correct = true;
    for (int64_t n : opt.sizes) {
        const size_t bytes = static_cast<size_t>(n) * sizeof(float);
        std::vector<float> h_a(n), h_b(n), h_c(n);
        for (int64_t i = 0; i < n; ++i) {
            h_a[i] = input_value(i, 0x9e3779b9u);
            h_b[i] = input_value(i, 0x85ebca6bu);
        }
        float *d_a = nullptr, *d_b = nullptr, *d_c = nullptr;
        HIP_CHECK(hipMalloc(&d_a, bytes));
        HIP_CHECK(hipMalloc(&d_b, bytes));
        HIP_CHECK(hipMalloc(&d_c, bytes));
        HIP_CHECK(hipMemcpy(d_a, h_a.data(), bytes, hipMemcpyHostToDevice));
        HIP_CHECK(hipMemcpy(d_b, h_b.data(), bytes, hipMemcpyHostToDevice));

        const int64_t work = (n + 3) / 4;
        const int64_t max_blocks = static_cast<int64_t>(prop.multiProcessorCount) * 16;
        int64_t blocks64 = (work + kThreads - 1) / kThreads;
        if (blocks64 > max_blocks) blocks64 = max_blocks;
        const dim3 grid(static_cast<unsigned>(blocks64 > 0 ? blocks64 : 1));
        const dim3 block(kThreads);

        auto launch = [&]() {
            hipLaunchKernelGGL(vector_add_kernel, grid, block, 0, 0, d_a, d_b, d_c, n);
            HIP_CHECK_LAUNCH();
        };
        // Every element of a freshly poisoned output is compared with the host's sum.
        auto check = [&]() -> int64_t {
            HIP_CHECK(hipMemcpy(h_c.data(), d_c, bytes, hipMemcpyDeviceToHost));
            int64_t bad = 0;
            for (int64_t i = 0; i < n; ++i) {
                const float want = h_a[i] + h_b[i];
                if (!(h_c[i] == want)) {
                    if (bad < 5) std::fprintf(stderr, "n=%lld: c[%lld] = %g, expected %g\n",
                                              static_cast<long long>(n), static_cast<long long>(i), h_c[i], want);
                    ++bad;
                }
            }
            return bad;
        };

        HIP_CHECK(hipMemset(d_c, 0xFF, bytes));  // all-ones bits: NaN
        HIP_CHECK(hipDeviceSynchronize());
        HIP_CHECK(hipEventRecord(start, 0));
        launch();
        HIP_CHECK(hipEventRecord(stop, 0));
        HIP_CHECK(hipEventSynchronize(stop));
        float first_ms = 0.0f;
        HIP_CHECK(hipEventElapsedTime(&first_ms, start, stop));
        int64_t mismatches = check();

        for (int w = 1; w < opt.warmup; ++w) launch();
        HIP_CHECK(hipDeviceSynchronize());

        std::vector<float> samples;
        double total_ms = 0.0;
        while (static_cast<int>(samples.size()) < opt.max_reps &&
               (total_ms < opt.min_time_ms || static_cast<int>(samples.size()) < opt.min_reps)) {
            if (flush) HIP_CHECK(hipMemset(flush, static_cast<int>(samples.size() & 0xFF), flush_bytes));
            HIP_CHECK(hipEventRecord(start, 0));
            launch();
            HIP_CHECK(hipEventRecord(stop, 0));
            HIP_CHECK(hipEventSynchronize(stop));
            float ms = 0.0f;
            HIP_CHECK(hipEventElapsedTime(&ms, start, stop));
            samples.push_back(ms);
            total_ms += ms;
        }

        // Once more after the timed repetitions, on a re-poisoned output.
        HIP_CHECK(hipMemset(d_c, 0xFF, bytes));
        launch();
        HIP_CHECK(hipDeviceSynchronize());
        mismatches += check();

        const bool correct = mismatches == 0;
        all_correct = all_correct && correct;
        std::printf("RESULT,%lld,%d,%lld,%.6f,", static_cast<long long>(n), correct ? 1 : 0,
                    static_cast<long long>(mismatches), first_ms);
        for (size_t i = 0; i < samples.size(); ++i) std::printf(i ? ";%.6f" : "%.6f", samples[i]);
        std::printf("\n");
        std::fflush(stdout);

        HIP_CHECK(hipFree(d_a));
        HIP_CHECK(hipFree(d_b));
        HIP_CHECK(hipFree(d_c));
    }
    HIP_CHECK(hipEventDestroy(start));
    HIP_CHECK(hipEventDestroy(stop));
    if (flush) HIP_CHECK(hipFree(flush));
    if (!all_correct) {
        std::fprintf(stderr, "vector_add: wrong results (see RESULT lines)\n");
        return EXIT_WRONG_RESULT;
    }
    return EXIT_OK;
}
