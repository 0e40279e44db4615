fn main() {
    print!("{}", composer_coord::http::json());
}
