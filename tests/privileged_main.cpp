int dummy_main_placeholder;
