from services.workers.sglang.main import main

# Guarded: SGLang starts its scheduler and detokenizer with multiprocessing's spawn, which re-imports this module.
if __name__ == "__main__":
    main()
