from services.workers.vllm.main import main

# Guarded: vLLM starts its engine core with multiprocessing's spawn, which re-imports this module.
if __name__ == "__main__":
    main()
