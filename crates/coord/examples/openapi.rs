fn main() {
    print!("{}", composer_coord::http::doc::json());
}
